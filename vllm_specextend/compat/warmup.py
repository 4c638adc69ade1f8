"""vLLM's spec-decode kernels compiled before a server's first request.

Each server compiled them inside its first requests (vLLM's JIT monitor,
H200, 2026-11-30): the next-token preparation for each width of sampled
tokens (1 in a prompt's step, up to K + 1 in a decode step), the input
preparation, and the input copy for each block of tokens; and under async
scheduling the runner's correction of its computed-token counts
(``warm_up_batch_change``), which torch.compile compiles out of that
monitor's sight.

vLLM 0.26 picks ``copy_and_expand_eagle_inputs_kernel``'s ``BLOCK_SIZE_TOKENS``
from each step's longest query (``LLMBaseProposer.set_inputs_first_pass``:
``min(256, next_power_of_2(max_query_len + new slots))``), so a server
compiled it anew inside a request the first time a step's longest query fell
in each power of two: a decode step, a prompt chunk, a prompt's short tail.
Its counts and sliced inputs are not specialised under the plugin
(``model_patches.STEP_SHAPE_SPECIALISATION``), so one launch per block compiles
what such steps use.
"""

from __future__ import annotations

import importlib

import torch

INPUT_COPY_BLOCKS = (2, 4, 8, 16, 32, 64, 128, 256)
"""Every ``BLOCK_SIZE_TOKENS`` vLLM 0.26 picks: a query of at least one token
plus at least one new slot, at most 256 a block."""


def warm_up_spec_decode_kernels(proposer) -> int:
    """Launch vLLM's spec-decode kernels as a step does, one request each:
    ``eagle_prepare_next_token_padded_kernel`` for every width of sampled
    tokens (1 to K + 1: the batch's longest draft plus one, a draft cut short
    near a request's end included), ``eagle_prepare_inputs_padded_kernel``,
    the input copy for every block (``warm_up_input_copies``) and, under
    async scheduling, the runner's correction of computed tokens
    (``warm_up_batch_change``); returns how many launches and calls. On
    vLLM's CPU platform the kernels' names hold C++ ops: the same launches,
    nothing compiled."""
    module = importlib.import_module("vllm.v1.spec_decode.llm_base_proposer")
    i32 = dict(dtype=torch.int32, device=proposer.device)
    vocab_size = proposer.runner.input_batch.vocab_size
    num_spec = proposer.num_speculative_tokens
    widths = range(1, num_spec + 2)
    for sampled in widths:
        tokens = torch.full((1, sampled), -1, **i32)  # [1, sampled]
        module.eagle_prepare_next_token_padded_kernel[(1,)](
            tokens,
            torch.zeros(1, dtype=torch.bool, device=proposer.device),
            proposer.backup_next_token_ids.gpu,
            torch.empty(1, **i32),  # next token ids
            torch.empty(1, **i32),  # valid sampled tokens
            vocab_size, sampled, 1, tokens.stride(0),
            BLOCK_SIZE_TOKENS=1 << (sampled - 1).bit_length(),  # next power of 2
        )
    module.eagle_prepare_inputs_padded_kernel[(1,)](
        torch.tensor([num_spec], **i32),  # cu_num_draft_tokens
        torch.tensor([num_spec + 1], **i32),  # valid sampled tokens
        torch.tensor([0, num_spec + 1], **i32),  # query_start_loc
        torch.empty(1, **i32),  # token indices to sample
        torch.empty(1, **i32),  # rejected tokens
        1,
    )
    return (len(widths) + 1 + warm_up_input_copies(proposer)
            + warm_up_batch_change(proposer.runner))


def warm_up_input_copies(proposer) -> int:
    """Launch vLLM's ``copy_and_expand_eagle_inputs_kernel`` once per block
    (one request of one token, into ``proposer``'s own buffers, with the
    constants its steps pass), as ``set_inputs_first_pass`` does; returns
    how many launches. A proposer on EAGLE's pathway (no new slots) never
    runs it. On vLLM's CPU platform the name holds a C++ op: the same
    launches, nothing compiled."""
    if not proposer.needs_extra_input_slots:
        return 0
    module = importlib.import_module("vllm.v1.spec_decode.llm_base_proposer")
    kernel = module.copy_and_expand_eagle_inputs_kernel
    i32 = dict(dtype=torch.int32, device=proposer.device)
    token_ids = torch.zeros(1, **i32)  # [1]
    positions = torch.zeros(1, dtype=torch.int64, device=proposer.device)  # [1]
    query_start_loc = torch.tensor([0, 1], **i32)  # [2]
    slots = proposer.extra_slots_per_request
    for block in INPUT_COPY_BLOCKS:
        kernel[(1, 1)](
            target_token_ids_ptr=token_ids,
            target_positions_ptr=positions,
            next_token_ids_ptr=token_ids,
            out_input_ids_ptr=proposer.input_ids,
            out_positions_ptr=proposer.positions,
            out_is_rejected_token_mask_ptr=proposer.is_rejected_token_mask,
            out_is_masked_token_mask_ptr=proposer.is_masked_token_mask,
            out_new_token_indices_ptr=torch.empty(slots, **i32),  # [slots]
            out_hidden_state_mapping_ptr=torch.empty(1, **i32),  # [1]
            query_start_loc_ptr=query_start_loc,
            query_end_loc_ptr=query_start_loc[1:] - 1,  # [1]
            padding_token_id=0,
            parallel_drafting_token_id=proposer.parallel_drafting_token_id,
            total_input_tokens=1,
            num_padding_slots_per_request=slots,
            shift_input_ids=proposer.pass_hidden_states_to_model,
            BLOCK_SIZE_TOKENS=block,
        )
    return len(INPUT_COPY_BLOCKS)


BATCH_CHANGE_SIZES = ((1, 1), (2, 1), (1, 2), (2, 2))
"""(requests in a step, requests in the step before): vLLM compiles the
correction with ``torch.compile(dynamic=True)``, which still specialises a
size of 1, so a graph for each of these pairs serves every step."""


def warm_up_batch_change(runner, fn=None) -> int:
    """Compile vLLM 0.26's ``update_num_computed_tokens_for_batch_change``
    (``v1/spec_decode/utils.py``, run by ``GPUModelRunner._prepare_inputs``
    under async speculative decoding) for every ``BATCH_CHANGE_SIZES`` pair
    before a server's first request; returns how many calls. Each runs as a
    step's does: on copies of the runner's buffers made outside inference
    mode (as the runner's own were), sliced, with a step's fresh tensors,
    inside ``torch.inference_mode`` (as ``execute_model`` runs), since
    Dynamo's guards check grad mode and which tensors are inference tensors.
    So no state changes, and steps reuse these graphs. Without it a
    speculative server compiles the correction again inside its first step
    with two requests after one, and for each pair first met; vLLM's issue
    39790 reports the first-call cost. ``fn``: a stand-in for vLLM's
    (tests)."""
    if not getattr(runner, "use_async_spec_decode", False):
        return 0
    if fn is None:
        utils = importlib.import_module("vllm.v1.spec_decode.utils")
        fn = utils.update_num_computed_tokens_for_batch_change
    device = runner.num_computed_tokens.device
    for num_reqs, prev_reqs in BATCH_CHANGE_SIZES:
        computed = runner.num_computed_tokens.clone()  # [max_num_reqs]
        accepted = runner.num_accepted_tokens.gpu.clone()  # [max_num_reqs]
        drafts = runner.prev_num_draft_tokens.gpu.clone()  # [max_num_reqs]
        # Rows 0..num_reqs-1 were rows of the step before, some new (-1).
        prev = runner.prev_positions.gpu.clone()  # [max_num_reqs] int64
        prev[:num_reqs] = torch.arange(num_reqs, device=device) % (prev_reqs + 1) - 1
        with torch.inference_mode():
            fn(
                computed,
                accepted[:num_reqs],  # [num_reqs]
                prev[:num_reqs],  # [num_reqs]
                torch.ones(prev_reqs, dtype=torch.int32, device=device),
                drafts,
                runner.input_batch.num_computed_tokens_cpu_tensor[:num_reqs].to(
                    device=device),  # [num_reqs]
            )
    return len(BATCH_CHANGE_SIZES)
