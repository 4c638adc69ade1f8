"""The proposer's side of ``deferral.py``: which steps keep their draft pass
over prompt chunks, and the kept passes run through vLLM's propose.

``deferral.py`` holds the kept passes and says why they wait (issue #22's
time to first token). Here is what takes vLLM's runner and propose: a step
keeps its pass when no row samples (``compat.samples_no_row``) and returns
zero drafts, as vLLM does when the drafter cannot run. A step whose rows
are such prompt chunks at one end and sampling rows at the other is cut in
two (``Cut``): the chunks' pass is kept, the other rows draft now through
vLLM's propose over their own rows (``compat.split_rows``); greedy drafts
only, as a sampled draft reads each row's sampling parameters. The chunks
come last where requests decode while another prefills (vLLM schedules
running requests first), and first where requests prefill side by side and
a later row's shorter prompt ends first (seen on a GPU, 2026-11-28: the
persistent batch keeps each request's row). Any other step, a cut step whose
drafting rows hold kept passes, a block copy or a finished request runs the
kept passes first, oldest first, each as vLLM's propose with K = 0. So a
batch's first tokens no longer wait for the draft's passes over the other
prompts (issue #45), and each request's passes still run in order, before its
first draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_specextend import compat
from vllm_specextend.config import SpecExtendConfig


@dataclass(frozen=True)
class Cut:
    """A step cut in two at row ``at``: its prompt chunks that end no prompt
    (their pass kept) before it (``kept_first``) or from it on."""

    at: int
    kept_first: bool

    def kept(self, num_reqs: int) -> slice:
        return slice(0, self.at) if self.kept_first else slice(self.at, num_reqs)

    def drafting(self, num_reqs: int) -> slice:
        return slice(self.at, num_reqs) if self.kept_first else slice(0, self.at)


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

    def _drops_pass(self, cad, mm_embed_inputs) -> bool:
        """Whether this step's pass over prompt chunks is not run at all:
        no row samples, and every row's prompt is pooled
        (``draft_prompt_pool``: the step that ends it writes its draft KV)."""
        return (self._pool_min_prompt() is not None and self.runner is not None
                and mm_embed_inputs is None and compat.samples_no_row(self.runner)
                and self._pooled_prompts(slice(0, cad.num_reqs), cad.num_reqs))

    def _pool_min_prompt(self) -> int | None:
        # A proposer built without __init__ (unit tests) has no config.
        cfg = getattr(self, "cfg", None)
        return None if cfg is None else cfg.pool_min_prompt

    def _pooled_prompts(self, rows: slice, num_reqs: int) -> bool:
        """Whether every row in ``rows`` holds a prompt whose pass is pooled."""
        pool_min = self._pool_min_prompt()
        if pool_min is None:
            return False
        num_prompt = compat.batch_num_prompt_tokens(self.runner, num_reqs)
        return bool((num_prompt[rows] >= pool_min).all())

    def _split_point(self, cad, mm_embed_inputs, sampling_metadata,
                     num_speculative_tokens) -> Cut | None:
        """Where the step is cut: its rows are prompt chunks that end no
        prompt at one end and sampling rows at the other; None where it has
        no such cut (or drafts no token, or drafts sampled tokens)."""
        if (self._deferral_blocker is not None or self.runner is None
                or mm_embed_inputs is not None or num_speculative_tokens == 0
                or not self._drafts_greedily(sampling_metadata)):
            return None
        discard = compat.discarded_rows(self.runner, cad.num_reqs)  # [num_reqs]
        at = int((discard != discard[0]).argmax())
        if at == 0 or (discard[at:] == discard[0]).any():
            return None  # one kind of row only, or more than two runs
        return Cut(at, kept_first=bool(discard[0]))

    def _drafts_greedily(self, sampling_metadata) -> bool:
        """vLLM samples drafts only with probabilistic draft sampling and a
        non-greedy batch (the captured routine, too, replays greedy steps only)."""
        return (not self._enable_probabilistic_draft_probs
                or sampling_metadata.all_greedy)

    def _runs_kept_first(self, keep: bool, cut: Cut | None, num_reqs: int) -> bool:
        """Whether the kept passes run before this step: unless it keeps its
        pass, or is cut and none of its drafting rows holds a kept pass."""
        if keep:
            return False
        if cut is None:
            return True
        ids = compat.batch_req_ids(self.runner, num_reqs)
        return self.deferral.holds_any(ids[cut.drafting(num_reqs)])

    def _propose_split(self, cut, view, num_speculative_tokens, token_ids,
                       positions, next_token_ids, token_indices_to_sample, cad,
                       num_rejected, pooled_step=None) -> torch.Tensor:
        """The chunks' pass kept, the other rows drafted through vLLM's
        propose over themselves and their rows of the view. The first pass
        shifts tokens within each row, so every row's inputs, and their
        drafts, are those of the whole step. ``[num_reqs, K]``."""
        num_reqs = cad.num_reqs
        head, tail = compat.split_rows(cad, self.runner, cut.at)
        n = head.num_actual_tokens
        # Each part's metadata and tokens: the kept part's, the drafting part's.
        parts = [(head, slice(0, n)), (tail, slice(n, n + tail.num_actual_tokens))]
        (kept_cad, kept_tokens), (cad_d, tokens_d) = (
            parts if cut.kept_first else parts[::-1])
        kept, drafting = cut.kept(num_reqs), cut.drafting(num_reqs)
        if self._pooled_prompts(kept, num_reqs):
            self.stats.dropped_prefill_passes += 1
        else:
            self.deferral.keep(
                compat.batch_req_ids(self.runner, num_reqs)[kept],
                token_ids[kept_tokens], positions[..., kept_tokens],
                next_token_ids[kept], kept_cad,
                None if view is None else view.rows(kept.start, kept.stop))
        self.stats.split_prefill_steps += 1
        self._view = None if view is None else view.rows(drafting.start, drafting.stop)
        if self._lookup_rows is not None:  # lookup_tokens: the drafting rows'
            self._lookup_rows = self._lookup_rows.rows(drafting.start, drafting.stop)
        sample = token_indices_to_sample
        if sample is not None:
            # Indices into the step's tokens: into the drafting rows' own.
            sample = sample[drafting] - tokens_d.start
        tokens, pos = token_ids[tokens_d], positions[..., tokens_d]
        if pooled_step is not None:
            # Pooled prompts end in the drafting rows (the kept ones end none).
            tokens, pos, sample, cad_d, self._first_view = self._pooled_inputs(
                pooled_step, drafting.start, tokens, pos, sample, cad_d,
                next_token_ids[drafting])
        drafts = self._greedy_propose(
            num_speculative_tokens, tokens, pos,
            None, next_token_ids[drafting], sample, cad_d,
            None if num_rejected is None else num_rejected[drafting])
        # The kept rows' drafts are discarded, as in a kept step. [num_reqs, K]
        zeros = drafts.new_zeros((kept.stop - kept.start, drafts.shape[1]))
        return torch.cat([zeros, drafts] if cut.kept_first else [drafts, zeros])

    def _keep_pass(self, cad, token_ids, positions, next_token_ids,
                   num_speculative_tokens, view=None, drop=False) -> torch.Tensor:
        # The runner discards every row's drafts this step: zeros, as vLLM's
        # own when the drafter cannot run. [num_reqs, K]
        if drop:
            self.stats.dropped_prefill_passes += 1
        else:
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
        passes = self.deferral.take()
        try:
            while passes:
                kept = passes[0]
                self._view = kept.view  # the funnel reads through it
                self._first_pass_only(kept.token_ids, kept.positions,
                                      kept.next_token_ids, kept.common_attn_metadata)
                passes.pop(0)
                self.stats.deferred_prefill_passes += 1
        finally:
            self._view = None
            # A pass that raised stays kept, with those after it.
            self.deferral.passes[:0] = passes

    def _first_pass_only(self, token_ids, positions, next_token_ids, cad) -> None:
        """vLLM's propose with K = 0: its first forward alone, the one that
        writes the rows' draft KV (a kept pass, a pooled pass run alone).
        vLLM's propose keeps the K it was last called with: restored here."""
        k = getattr(self, "num_speculative_tokens", None)
        try:
            self._greedy_propose(0, token_ids, positions, None, next_token_ids,
                                 None, cad)
        finally:
            if k is not None:
                self.num_speculative_tokens = k

    def before_block_copies(self) -> None:
        """vLLM is about to copy whole KV blocks (the draft's too) at the
        start of a step: the kept passes write theirs first."""
        self._run_kept_passes()
