"""The drafter with weights and KV of its own (a draft model, an EAGLE head).

``SeparateDraft`` is the hooks of ``SpecExtendMixin`` that differ from a
target drafting for itself (``self_draft.TargetAsDraft``): which attention
layers the scoring leaves out, which rows draft through their selection.
"""

from __future__ import annotations

import numpy as np

from vllm_specextend.retrieval.planner import BatchLens


class SeparateDraft:
    """The drafter has weights and KV of its own (a draft model, an EAGLE
    head); the SpecExtend mixin's hooks for it. ``self_draft.TargetAsDraft``
    is the other kind."""

    def _scoring_excludes(self) -> set[str]:
        """Attention layers that are not the target's: the draft's own."""
        return self._draft_attn_layer_names

    def _drafting_rows(self, lens: BatchLens) -> np.ndarray:
        """Rows whose draft forwards may read through their selection: those
        past prefill. A row that finishes its prompt this step drafts over it
        in full, as the draft's own KV of the prompt is written by this pass
        (with ``draft_prefill_window``: through the chunk's window, as every
        prompt chunk, ``ViewBuilder.params``)."""
        return lens.decoding
