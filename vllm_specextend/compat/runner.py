"""Reads of vLLM's V1 model runner: the persistent batch and live requests.

Row ``r`` of a drafting step is row ``r`` of ``GPUModelRunner.input_batch``
(the CPU runner subclasses it), so these accessors map rows to request ids
and lengths without copying the runner's arrays.
"""

from __future__ import annotations

import numpy as np


def batch_req_ids(runner, num_reqs: int) -> list[str]:
    """Request id of each batch row: ``[num_reqs]``."""
    return runner.input_batch.req_ids[:num_reqs]


def batch_num_prompt_tokens(runner, num_reqs: int) -> np.ndarray:
    """Prompt length of each batch row: ``[num_reqs]`` int."""
    return runner.input_batch.num_prompt_tokens[:num_reqs]


def row_token_ids(runner, row: int, num_tokens: int) -> np.ndarray:
    """The first ``num_tokens`` token ids (prompt, then output) of batch row
    ``row``: ``[num_tokens]`` int32, the runner's host copy."""
    return runner.input_batch.token_ids_cpu[row, :num_tokens]


def batch_seq_lens_cpu(runner, num_reqs: int) -> np.ndarray:
    """This step's context lengths, ``[num_reqs]`` int; an upper bound under
    async scheduling.

    vLLM 0.26: ``CommonAttentionMetadata.unpadded`` drops
    ``seq_lens_cpu_upper_bound``, so read the runner's source of it.
    """
    return runner.optimistic_seq_lens_cpu[:num_reqs].numpy()


def live_req_ids(runner):
    """Ids of the requests the runner holds state for (a set-like view)."""
    return runner.requests.keys()


def model_input_buffers(runner):
    """The runner's persistent ``input_ids`` ``[max_num_tokens]`` int32 and
    ``positions`` ``[max_num_tokens]`` int64 device buffers.

    vLLM 0.26: the target's forwards read ``input_ids.gpu[:n]`` and
    ``positions[:n]``, so its CUDA graphs were captured reading these addresses.
    """
    return runner.input_ids.gpu, runner.positions


def samples_no_row(runner) -> bool:
    """Every row of this step computes a prompt chunk that does not end its
    prompt: the runner discards whatever it samples or drafts for them.

    vLLM 0.26: ``_is_all_reqs_chunked_prefill`` reads the host half of
    ``discard_request_mask``, set in ``_prepare_inputs`` from host lengths, so
    asking does not wait for the device.
    """
    return runner._is_all_reqs_chunked_prefill()


def discarded_rows(runner, num_reqs: int) -> np.ndarray:
    """Rows whose sampled token the runner discards this step (prompt chunks
    that do not end their prompt): ``[num_reqs]`` bool.

    vLLM 0.26: the host half of ``discard_request_mask``, set in
    ``_prepare_inputs`` from host lengths (what ``samples_no_row`` reads).
    """
    return runner.discard_request_mask.np[:num_reqs]


def split_rows(cad, runner, first: int):
    """``cad`` cut into its rows before ``first`` and from it on, each as the
    attention metadata of a batch of its own (tokens, lengths, block tables
    and slot mappings of those rows): ``(head, tail)``.

    vLLM 0.26: ``split_attn_metadata``, what micro-batching cuts a batch with;
    it wants the host bound of the lengths, which the drafter's metadata does
    not carry (``batch_seq_lens_cpu``).
    """
    import torch
    from vllm.v1.worker.ubatch_utils import UBatchSlice, split_attn_metadata

    if cad.seq_lens_cpu_upper_bound is None:
        bound = torch.from_numpy(batch_seq_lens_cpu(runner, cad.num_reqs).copy())
        cad = cad.replace(seq_lens_cpu_upper_bound=bound)
    qsl = cad.query_start_loc_cpu
    cut, end = int(qsl[first]), int(qsl[cad.num_reqs])
    head, tail = split_attn_metadata(
        [UBatchSlice(slice(0, first), slice(0, cut)),
         UBatchSlice(slice(first, cad.num_reqs), slice(cut, end))], cad)
    return head, tail


def copies_kv_blocks(scheduler_output) -> bool:
    """This step starts by copying whole KV blocks, every layer's.

    vLLM 0.26: ``_update_states`` copies ``kv_cache_block_copies`` (prefix
    hits that end inside a block with several KV cache groups, mamba
    ``align`` mode) before the step's forwards, so a kept draft pass that
    writes a source block must run first (``deferral.py``).
    """
    return bool(scheduler_output.kv_cache_block_copies)


def prefill_deferral_blocker(vllm_config) -> str | None:
    """Why draft passes over prompt chunks must run in their own step on
    this engine (``deferral.py``), or None."""
    if vllm_config.parallel_config.data_parallel_size != 1:
        return "data parallel ranks pad every draft forward to one size together"
    if vllm_config.kv_transfer_config is not None:
        return "a KV connector saves a step's blocks when the step ends"
    return None
