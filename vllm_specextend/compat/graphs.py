"""What a captured draft routine needs from vLLM (``draft_graph.py``).

vLLM 0.26: the drafter's attention metadata builders take a
``CommonAttentionMetadata``; FlashAttention's reads the block table,
``seq_lens`` and ``query_start_loc`` from device tensors and bakes only host
bounds (``max_query_len``, ``max_seq_len``, the split count) into each call,
so a graph captured over persistent buffers replays over new contents
(``AttentionCGSupport.ALWAYS``, as the target's FULL decode graphs do).
"""

from __future__ import annotations

import torch

from vllm_specextend.compat.engine import position_rows
from vllm_specextend.compat.layers import attention_layer
from vllm_specextend.compat.symbols import load

_CAPTURABLE_BUILDERS = ("FlashAttentionMetadataBuilder",)
"""Builders whose drafting metadata reads only device tensors and host bounds."""


def decode_attn_metadata(**fields):
    """A ``CommonAttentionMetadata`` of a causal batch from the given fields."""
    return load("CommonAttentionMetadata")(causal=True, **fields)


def block_table_width(runner, kv_cache_group: int) -> int:
    """Columns of the runner's block table for ``kv_cache_group`` (kernel
    blocks per request), the width every step's table has."""
    return runner.input_batch.block_table[kv_cache_group].block_table.gpu.shape[1]


def draft_graph_blocker(vllm_config, attn_groups, capture: bool) -> str | None:
    """Why this engine's draft routine cannot be captured, or None.

    ``capture=False`` (the static body without a graph) only needs one
    engine process per model copy.
    """
    parallel = vllm_config.parallel_config
    # Tensor parallel is captured: the draft's collectives go into the graph
    # inside vLLM's capture context (``distributed.capture_stream``), and every
    # rank takes the same replay-or-eager decision from the same host lengths.
    if parallel.pipeline_parallel_size != 1:
        return "pipeline parallel: the draft runs on the last stage only"
    if parallel.data_parallel_size != 1:
        return "data parallel: draft batches are padded across ranks"
    if (rows := position_rows(vllm_config)) > 1:
        return (f"the target's positions have {rows} rows (M-RoPE or XD-RoPE); "
                "the routine's buffers hold one")
    if not capture:
        return None
    if vllm_config.compilation_config.cudagraph_mode == load("CUDAGraphMode").NONE:
        return "CUDA graphs are off (enforce_eager or cudagraph_mode NONE)"
    names = {type(g.get_metadata_builder()).__name__ for g in attn_groups}
    if not names or not names <= set(_CAPTURABLE_BUILDERS):
        return f"draft attention backend {sorted(names)} is not FlashAttention"
    return None


def eagle_input_width(proposer) -> int:
    """Features per verified token an EAGLE head's ``propose`` takes from the
    target: EAGLE-3's concatenated auxiliary hidden states (the input width of
    its ``fc``), else the target's hidden size.

    vLLM 0.26: EAGLE-3 heads (``llama_eagle3`` and its kin) keep ``fc`` on
    their inner ``model``; ``ReplicatedLinear.input_size`` is its width.
    """
    if proposer.method == "eagle3" and proposer.eagle3_use_aux_hidden_state:
        return proposer.model.model.fc.input_size
    return proposer.vllm_config.model_config.get_hidden_size()


def schedule_draft_attention(proposer, per_group, num_reqs: int) -> None:
    """Give the captured draft routine's FlashAttention metadata FA3's
    ahead-of-time split schedule, planned for the draft's own heads.

    vLLM builds drafting metadata with ``fast_build=True`` ("not worth the
    overhead" for a few eager forwards), so every FlashAttention call then
    schedules its own splits: one ``prepare_varlen_num_blocks`` kernel per
    layer pass, 64 a step for a 16-layer draft at K=4. Captured, one schedule
    per forward is recorded like the rest and replays over the new
    ``seq_lens``. The builder's own AOT path cannot serve: it plans with the
    target's head counts and head size (``model_config``), and FA3 refuses a
    schedule of another shape. The split bound stays vLLM's
    (``max_num_splits``), as on the piecewise path. Only FA3 plans ahead, as
    in vLLM's builder (not FA2 or FA4, not under ``VLLM_BATCH_INVARIANT``);
    layers with a sliding window, soft cap, sinks, ALiBi, a per-sequence
    causal mask or a quantized KV cache keep vLLM's in-kernel scheduling.
    """
    import vllm.envs as envs
    from vllm.v1.attention.backends import fa_utils

    if envs.VLLM_BATCH_INVARIANT:
        return
    for metadata, group in zip(per_group, proposer.draft_attn_groups):
        if getattr(metadata, "scheduler_metadata", "absent") is not None:
            continue  # not FlashAttention, or already scheduled
        impl = attention_layer(proposer.vllm_config, group.layer_names[0]).impl
        spec = group.kv_cache_spec
        causal = getattr(metadata, "causal", True)
        if (getattr(impl, "vllm_flash_attn_version", None) != 3
                or not isinstance(causal, bool)
                or spec.dtype not in (torch.float16, torch.bfloat16)
                or tuple(getattr(impl, "sliding_window", None) or (-1, -1)) != (-1, -1)
                or getattr(impl, "logits_soft_cap", 0) or getattr(impl, "sinks", None) is not None
                or getattr(impl, "alibi_slopes", None) is not None):
            continue
        metadata.scheduler_metadata = fa_utils.get_scheduler_metadata(
            batch_size=num_reqs,
            max_seqlen_q=metadata.max_query_len,
            max_seqlen_k=metadata.max_seq_len,
            num_heads_q=impl.num_heads,
            num_heads_kv=impl.num_kv_heads,
            headdim=impl.head_size,
            cache_seqlens=metadata.seq_lens,
            qkv_dtype=spec.dtype,
            cu_seqlens_q=metadata.query_start_loc,
            page_size=spec.block_size,
            causal=causal,
            num_splits=metadata.max_num_splits,
        )


def set_attn_splits(attn_metadata, num_splits: int) -> None:
    """Cap a FlashAttention call's KV splits (``FlashAttentionMetadata.
    max_num_splits``, passed as ``num_splits``); other backends have none."""
    if hasattr(attn_metadata, "max_num_splits"):
        attn_metadata.max_num_splits = num_splits
