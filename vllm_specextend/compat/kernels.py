"""vLLM's spec-decode Triton kernels compiled before a server's first request.

vLLM 0.26 picks ``copy_and_expand_eagle_inputs_kernel``'s ``BLOCK_SIZE_TOKENS``
from each step's longest query (``LLMBaseProposer.set_inputs_first_pass``:
``min(256, next_power_of_2(max_query_len + new slots))``), so a server
compiled it anew inside a request the first time a step's longest query fell
in each power of two: a decode step, a prompt chunk, a prompt's short tail.
Its other step-dependent arguments are not specialised under the plugin
(``patches.STEP_SHAPE_SPECIALISATION``), so one launch per block compiles
everything a step can ask for.
"""

from __future__ import annotations

import importlib

import torch

INPUT_COPY_BLOCKS = (2, 4, 8, 16, 32, 64, 128, 256)
"""Every ``BLOCK_SIZE_TOKENS`` vLLM 0.26 picks: a query of at least one token
plus at least one new slot, at most 256 a block."""


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
