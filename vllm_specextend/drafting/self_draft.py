"""The target drafts for itself through the view of its own KV (``self_draft``).

With ``--spec-extend '{"self_draft": true}'`` no second model is loaded: the
drafter runs the target's own modules, and its attention reads the target's own
paged KV through the CMR view (sinks + top-k chunks + recent window), as
MagicDec and TriForce do. The draft needs no prefill and adds no KV memory.

vLLM plumbing: the engine is configured as ``draft_model`` with the target as
its draft (``speculative_config_for``), which gives the scheduler's lookahead
slots, the rejection sampler and the drafting loop; ``TargetAsDraft`` then
replaces what a separate draft model would need:

* ``load_model``: the drafter's model is the target, its attention layers are
  all of the target's, and no weights are loaded;
* ``set_inputs_first_pass``: a separate draft re-runs the tokens the target
  just verified to fill its own KV; the target already wrote that KV, so the
  first draft forward runs only the bonus token, at the position after the
  accepted ones.

Why writing draft KV into the target's cache is exact. Draft forwards write
the KV of the bonus token and of draft tokens 1..K-1 at positions
``p .. p+K-1``, where ``p`` is the request's count of computed tokens after
this step's rollback. None of these positions counts as computed yet, and the
scheduler allocated them to this request alone (its lookahead slots), so no
cached or shared block holds them. A position becomes computed only through a
target forward that schedules it, and every target forward writes the KV of
the tokens it schedules before its attention reads them. So each draft-written
slot is overwritten by the target before any target forward reads it: the
next verification covers ``p .. p+K`` (or a prefix of it, the rest waits for
later steps). Reads by the draft itself see draft-written KV, which only
affects what it proposes; the target verifies every token with exact KV, so
greedy output equals plain decoding and sampling keeps the target's
distribution.

K = 0 steps (vLLM's per-batch-size speculation off switch) run no draft
forward at all: there is no draft KV to keep in sync.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from vllm_specextend import compat
from vllm_specextend.config import ADDITIONAL_CONFIG_KEY, SpecExtendConfigError

DEFAULT_NUM_SPECULATIVE_TOKENS = 3


def speculative_config_for(args) -> None:
    """Before vLLM builds its config: with ``self_draft`` on, speculate with
    ``draft_model`` whose draft is the target itself.

    ``args`` is vLLM's ``EngineArgs``; ``--spec-tokens`` /
    ``--num-speculative-tokens`` or ``speculative_config`` give K.
    """
    raw = (args.additional_config or {}).get(ADDITIONAL_CONFIG_KEY)
    if not isinstance(raw, dict) or not raw.get("self_draft"):
        return
    spec = dict(args.speculative_config or {})
    method = args.spec_method or spec.get("method")
    model = args.spec_model or spec.get("model")
    if method not in (None, "draft_model"):
        raise SpecExtendConfigError(
            f"spec_extend.self_draft drafts with the target itself, but the "
            f"speculative method is {method!r}; drop the method (and any EAGLE "
            "head), or set self_draft to false."
        )
    if model is not None and model != args.model:
        raise SpecExtendConfigError(
            f"spec_extend.self_draft drafts with the target itself, but a separate "
            f"draft model was given ({model}); drop --speculative-model, or set "
            "self_draft to false to draft with it."
        )
    if args.spec_method is None:
        spec["method"] = "draft_model"
    if args.spec_model is None:
        spec["model"] = args.model
    if args.spec_tokens is None:
        spec.setdefault("num_speculative_tokens", DEFAULT_NUM_SPECULATIVE_TOKENS)
    args.speculative_config = spec


class TargetAsDraft:
    """Goes between the SpecExtend mixin and ``DraftModelProposer`` (the
    counterpart of ``separate_draft.SeparateDraft``): the drafting loop's model,
    layers and first pass for a target drafting for itself."""

    _self_draft_rejected: torch.Tensor | None = None

    @override
    def load_model(self, target_model) -> None:
        # No super(): a separate draft would be loaded and get layers of its own.
        self.model = target_model
        self._draft_attn_layer_names = compat.kv_cache_layer_names(self.vllm_config)
        if not self._draft_attn_layer_names:
            raise RuntimeError("vllm-specextend found no target attention layer.")
        # Draft forwards replay the target's own piecewise CUDA graphs, which
        # read their inputs from the addresses they were captured with: with
        # buffers of its own the drafter would run on the target's last inputs,
        # and graphs it captured first would feed the target the drafter's.
        # So the drafter writes its inputs where the target's forwards read
        # theirs (the target refills them before its next forward; the first
        # pass below needs neither target_token_ids nor target_positions).
        self.input_ids, self.positions = compat.model_input_buffers(self.runner)

    def _scoring_excludes(self) -> set[str]:
        return set()

    def _drafting_rows(self, lens):
        # No draft prefill: a row drafts from the bonus token as soon as its
        # prompt is done, so it may read through a view on that very step.
        return lens.seq >= lens.num_prompt

    @override
    def propose(self, num_speculative_tokens, target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata, mm_embed_inputs=None,
                num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        batch_size = common_attn_metadata.batch_size()
        if num_speculative_tokens == 0:
            return torch.empty(batch_size, 0, dtype=torch.int64, device=self.device)
        # The first pass below drops the rejected drafts itself; vLLM's loop
        # would subtract them again from the lengths it is handed.
        self._self_draft_rejected = num_rejected_tokens_gpu
        self.retriever.capturing = False
        try:
            return super().propose(
                num_speculative_tokens, target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata,
                mm_embed_inputs=mm_embed_inputs, num_rejected_tokens_gpu=None,
                slot_mappings=slot_mappings,
            )
        finally:
            self.retriever.capturing = True
            self._self_draft_rejected = None

    @override
    def set_inputs_first_pass(self, target_token_ids, next_token_ids,
                              target_positions, target_hidden_states,
                              token_indices_to_sample, cad, num_rejected_tokens_gpu):
        """One token per row: the bonus token, at the position after the
        accepted ones, with the context the target verified less the rejected
        drafts. Returns (num_tokens, token_indices_to_sample, cad)."""
        batch_size = cad.batch_size()
        context = cad.seq_lens  # [batch_size] verified tokens, rejected included
        if self._self_draft_rejected is not None:
            context = context - self._self_draft_rejected
        position = context.to(torch.int64)  # [batch_size] of the bonus token
        clamped = position.clamp(max=self.max_model_len - 1)
        block_ids = cad.block_table_tensor.gather(
            1, (clamped // self.block_size).unsqueeze(1)
        ).squeeze(1)
        slots = block_ids.to(torch.int64) * self.block_size + clamped % self.block_size
        slots.masked_fill_(position >= self.max_model_len, compat.PADDING_SLOT_ID)
        self.input_ids[:batch_size] = next_token_ids
        self.positions[:batch_size] = clamped
        upper = cad.seq_lens_cpu_upper_bound
        new_cad = cad.replace(
            query_start_loc=self.arange[: batch_size + 1],
            query_start_loc_cpu=torch.from_numpy(
                self.token_arange_np[: batch_size + 1]
            ).clone(),
            seq_lens=(context + 1).to(cad.seq_lens.dtype),
            seq_lens_cpu_upper_bound=None if upper is None else upper + 1,
            _seq_lens_cpu=None,
            _num_computed_tokens_cpu=None,
            # Caches and per-token fields of the verification's layout.
            _num_computed_tokens_cache=None,
            _token_to_req_indices_cache=None,
            positions=None,
            is_prefilling=None,
            logits_indices_padded=None,
            num_logits_indices=None,
            num_actual_tokens=batch_size,
            max_query_len=1,
            max_seq_len=min(cad.max_seq_len + 1, self.max_model_len),
            slot_mapping=slots,
        )
        return batch_size, self.arange[:batch_size], new_cad

