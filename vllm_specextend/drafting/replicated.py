"""A draft model whole on every tensor-parallel rank (``draft_placement``).

Why: vLLM shards a draft model as it shards the target, so at TP every draft
forward all-reduces twice a layer and gathers its logits: 33 collectives for a
16-layer 1B draft, four forwards a step. Kept whole on each GPU, the draft
runs no collective, but each forward reads all its weights (2.5 GB for the
1B, about 0.75 ms on an H100) and its KV holds all of its heads. Measured
(docs/results.md, "Tensor parallel"): beside an 8B target at TP=2 on two
H100s the sharded draft won, 285 against 251 tok/s, so ``auto`` shards; the
routine's collectives are captured and cost less than reading the other
half of the weights. Replicated stays an option for drafts and hosts where
the collectives cost more (slower links, more ranks per draft).

How: vLLM 0.26 sizes each layer from the TP group when it builds it and
gathers logits over it in a forward. While the draft is built, warmed up,
captured and run, a one-rank group stands in for the TP group
(``compat.draft_tp_group``); chunk scoring and selection keep the target's
group. Every rank drafts from the same weights and inputs, so the same tokens;
rank 0's drafts are still broadcast (one small collective a step), so the
ranks verify the same tokens even where a kernel rounded differently.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from vllm_specextend import compat


class ReplicatedDraft:
    """Goes in front of ``SpecExtendMixin`` for a draft model: every entry
    into the draft's forwards runs inside the one-rank group when
    ``Settings.replicated_draft``; otherwise each hook only calls on."""

    _draft_group = None
    """The one-rank TP group of a replicated draft; None when sharded."""

    @override
    def load_model(self, target_model) -> None:
        if self.settings.replicated_draft:
            # Every rank loads at the same point: the group's creation is
            # collective over the world.
            self._draft_group = compat.one_rank_tp_group()
        with compat.draft_tp_group(self._draft_group):
            super().load_model(target_model)
        rank, size = compat.tp_rank_and_size()
        if size > 1 and rank == 0:
            compat.logger.info(
                "SpecExtend: the draft model is %s (draft_placement) over %d "
                "tensor-parallel ranks.", "whole on each" if self._draft_group
                is not None else "sharded", size)

    @override
    def propose(self, *args, **kwargs) -> torch.Tensor:
        with compat.draft_tp_group(self._draft_group):
            drafts = super().propose(*args, **kwargs)
        if self._draft_group is not None and isinstance(drafts, torch.Tensor):
            compat.tp_broadcast(drafts)  # [num_reqs, K], in place
        return drafts

    @override
    def dummy_run(self, *args, **kwargs):
        with compat.draft_tp_group(self._draft_group):
            return super().dummy_run(*args, **kwargs)

    @override
    def warm_up_kernels(self) -> None:
        with compat.draft_tp_group(self._draft_group):
            super().warm_up_kernels()

    @override
    def capture_graphs(self) -> None:
        with compat.draft_tp_group(self._draft_group):
            super().capture_graphs()

    @override
    def _run_kept_passes(self) -> None:
        # Kept passes over prompt chunks run from propose, and also when
        # requests end, before vLLM copies KV blocks, and on a reconfigure.
        with compat.draft_tp_group(self._draft_group):
            super()._run_kept_passes()

    @property
    def draft_placement(self) -> str:
        """``replicated`` or ``sharded``, as this engine resolved it."""
        return "replicated" if self._draft_group is not None else "sharded"
