"""The proposer's side of ``deferral.py``: which steps keep their draft pass
over prompt chunks, and the kept passes run through vLLM's propose.

``deferral.py`` holds the kept passes and says why they wait (issue #22's
time to first token). Here is what takes vLLM's runner and propose: a step
keeps its pass when no row samples (``compat.samples_no_row``) and returns
zero drafts, as vLLM does when the drafter cannot run; any other step, a
block copy or a finished request runs the kept passes first, oldest first,
each as vLLM's propose with K = 0.
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
