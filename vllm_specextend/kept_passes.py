"""The proposer's side of ``deferral.py``: which steps keep their draft pass
over prompt chunks, and the kept passes run through vLLM's propose.

``deferral.py`` holds the kept passes and says why they wait (issue #22's
time to first token). Here is what takes vLLM's runner and propose: a step
keeps its pass when no row samples (``compat.samples_no_row``) and returns
zero drafts, as vLLM does when the drafter cannot run. A step whose last
rows are such prompt chunks while the rows before them sample (a batch in
which some requests decode while another prefills: vLLM schedules running
requests first) is cut in two: the tail's pass is kept, the head drafts now
through vLLM's propose over its own rows (``compat.split_rows``); greedy
drafts only, as a sampled draft reads each row's sampling parameters. Any
other step, a split step whose drafting rows hold kept passes, a block copy
or a finished request runs the kept passes first, oldest first, each as
vLLM's propose with K = 0. So a batch's first tokens no longer wait for the
draft's passes over the other prompts (issue #45), and each request's passes
still run in order, before its first draft.
"""

from __future__ import annotations

import torch

from vllm_specextend import compat
from vllm_specextend.config import SpecExtendConfig


class KeptPasses:
    """Goes behind ``SpecExtendMixin`` (its base): the proposer's hooks for
    kept prompt passes. Reads the mixin's ``deferral`` (the
    ``PrefillDeferral``), ``stats`` and ``_view``; runs each pass through its
    ``_greedy_propose``. ``_defers_prefill``: which proposers may keep one."""

    _defers_prefill = False
    """Passes over prompt chunks can wait for a later step (``deferral.py``):
    a draft model's, whose first pass needs nothing of the target but the
    tokens. An EAGLE head reads the target's hidden states of the chunk."""

    def _prefill_deferral_blocker(self, cfg: SpecExtendConfig) -> str | None:
        if not cfg.defer_prefill_draft:
            return "defer_prefill_draft is false"
        if not self._defers_prefill:
            return "an EAGLE head or self_draft drafts from the target's step"
        # A proposer built without __init__ (unit tests) has no engine to defer in.
        return getattr(self, "_engine_deferral_blocker", "no engine")

    def _keeps_pass(self, mm_embed_inputs, num_rejected) -> bool:
        return (self._deferral_blocker is None and self.runner is not None
                and mm_embed_inputs is None and num_rejected is None
                and compat.samples_no_row(self.runner))

    def _split_point(self, cad, mm_embed_inputs, sampling_metadata,
                     num_speculative_tokens) -> int | None:
        """The first row of the step's tail of prompt chunks that end no
        prompt, where every row before it samples; None where the step has
        no such cut (or drafts no token, or drafts sampled tokens)."""
        if (self._deferral_blocker is not None or self.runner is None
                or mm_embed_inputs is not None or num_speculative_tokens == 0
                or not self._drafts_greedily(sampling_metadata)):
            return None
        discard = compat.discarded_rows(self.runner, cad.num_reqs)
        first = int(discard.argmax())
        if not discard[first] or first == 0 or not discard[first:].all():
            return None
        return first

    def _drafts_greedily(self, sampling_metadata) -> bool:
        """vLLM samples drafts only with probabilistic draft sampling and a
        non-greedy batch (the captured routine, too, replays greedy steps only)."""
        return (not self._enable_probabilistic_draft_probs
                or sampling_metadata.all_greedy)

    def _runs_kept_first(self, keep: bool, first: int | None) -> bool:
        """Whether the kept passes run before this step: unless it keeps its
        pass, or is cut and none of its drafting rows holds a kept pass."""
        if keep:
            return False
        return first is None or self.deferral.holds_any(
            compat.batch_req_ids(self.runner, first))

    def _propose_split(self, first, view, num_speculative_tokens, token_ids,
                       positions, next_token_ids, token_indices_to_sample, cad,
                       num_rejected) -> torch.Tensor:
        """The tail's pass kept, the head's rows drafted through vLLM's
        propose over themselves and their rows of the view. The first pass
        shifts tokens within each row, so every row's inputs, and the head's
        drafts, are those of the whole step. ``[num_reqs, K]``."""
        head, tail = compat.split_rows(cad, self.runner, first)
        n = head.num_actual_tokens
        num_reqs = cad.num_reqs
        self.deferral.keep(
            compat.batch_req_ids(self.runner, num_reqs)[first:],
            token_ids[n:n + tail.num_actual_tokens],
            positions[..., n:n + tail.num_actual_tokens],
            next_token_ids[first:num_reqs], tail,
            None if view is None else view.rows(first, num_reqs))
        self.stats.split_prefill_steps += 1
        self._view = None if view is None else view.rows(0, first)
        sample = token_indices_to_sample
        drafts = self._greedy_propose(
            num_speculative_tokens, token_ids[:n], positions[..., :n], None,
            next_token_ids[:first], None if sample is None else sample[:first],
            head, None if num_rejected is None else num_rejected[:first])
        # The tail's drafts are discarded, as in a kept step. [num_reqs, K]
        tail_drafts = drafts.new_zeros((num_reqs - first, drafts.shape[1]))
        return torch.cat([drafts, tail_drafts])

    def _keep_pass(self, cad, token_ids, positions, next_token_ids,
                   num_speculative_tokens, view=None) -> torch.Tensor:
        # The runner discards every row's drafts this step: zeros, as vLLM's
        # own when the drafter cannot run. [num_reqs, K]
        self.deferral.keep(compat.batch_req_ids(self.runner, cad.num_reqs),
                           token_ids, positions, next_token_ids, cad, view)
        # The runner reads the drafter's draft probabilities after propose;
        # vLLM's propose clears them first, so must a step that skips it.
        self._last_draft_probs = None
        return torch.zeros((cad.num_reqs, num_speculative_tokens),
                           dtype=torch.int64, device=self.device)

    @torch.inference_mode()
    def _run_kept_passes(self) -> None:
        """The kept passes, oldest first, each as vLLM's propose with K = 0:
        its first pass only, the one that writes the chunk's draft KV. In
        inference mode as vLLM's own step: they may run from the worker,
        before the runner's step (``on_requests_done``, block copies)."""
        if not len(self.deferral):
            return
        k = getattr(self, "num_speculative_tokens", None)
        passes = self.deferral.take()
        try:
            while passes:
                kept = passes[0]
                self._view = kept.view  # the funnel reads through it
                self._greedy_propose(
                    0, kept.token_ids, kept.positions, None, kept.next_token_ids,
                    None, kept.common_attn_metadata,
                )
                passes.pop(0)
                self.stats.deferred_prefill_passes += 1
        finally:
            self._view = None
            # A pass that raised stays kept, with those after it.
            self.deferral.passes[:0] = passes
            # vLLM's propose keeps the K it was last called with.
            if k is not None:
                self.num_speculative_tokens = k

    def before_block_copies(self) -> None:
        """vLLM is about to copy whole KV blocks (the draft's too) at the
        start of a step: the kept passes write theirs first."""
        self._run_kept_passes()
