"""Draft passes over prompt chunks, run after the step that computed them.

A long prompt is computed in chunks, one per engine step, and vLLM's draft
model runs a pass over each chunk right after the target's, to write its own
KV of those tokens. Until the chunk that ends the prompt, such a row samples
nothing (the runner discards it), yet its pass is queued on the GPU before the
target's next chunk: at 16K on an H100 the draft's passes over a prompt's
earlier chunks put ~93 ms before the first token (issue #22;
``benchmarks/results/serve/20261126T0236Z_h100_profile_prefill_16k_*``).

So a step in which every row is such a chunk keeps a copy of its pass's inputs
(``keep``) instead of running it, and returns no drafts, as vLLM does when the
drafter cannot run (``_input_fits_in_drafter``). The next step that drafts runs
the kept passes first, in order, then its own; a step whose finished or
preempted requests free blocks a kept pass writes runs them at its start. Each
draft forward thus runs on the same inputs over the same draft KV, in the same
order, as without deferral; only later, behind the target's next chunks, and
(with ``EARLY_OUTPUT_COPY``) behind the copy of the first token.

Kept passes run with K = 0: vLLM's propose then runs its first pass only, the
one that writes the chunk's draft KV. The K - 1 further forwards of a
discarded row write draft KV past the chunk's end, which the next chunk's pass
overwrites before any forward reads it.

Pure torch, no vLLM: the proposer's side (``kept_passes.py``) decides which
steps keep their pass and runs the kept ones through vLLM's propose.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

SHARED = {"shared": True}
"""Field metadata (``dataclasses.field(metadata=SHARED)``) of what a copy
shares instead of copying: per-engine state a kept pass writes, such as the
proposer's counters."""


@dataclass
class KeptPass:
    """One step's draft pass, its inputs copied out of the runner's buffers
    (the next step overwrites those)."""

    req_ids: frozenset[str]
    token_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    next_token_ids: torch.Tensor  # [num_reqs]
    common_attn_metadata: object  # vLLM's CommonAttentionMetadata, copied
    view: object = None
    """The pass's ``view.View`` (prompt chunks read through a window,
    ``draft_prefill_window``), copied; applied where its step would apply
    it, to the attention metadata of each forward, never to the slot
    mapping vLLM derives from the real table."""


class PrefillDeferral:
    """The kept passes, oldest first."""

    def __init__(self) -> None:
        self.passes: list[KeptPass] = []

    def keep(self, req_ids, token_ids, positions, next_token_ids, cad,
             view=None) -> None:
        self.passes.append(KeptPass(
            frozenset(req_ids), token_ids.clone(), positions.clone(),
            next_token_ids.clone(), copy_metadata(cad),
            None if view is None else copy_metadata(view),
        ))

    def holds_any(self, req_ids) -> bool:
        return any(not p.req_ids.isdisjoint(req_ids) for p in self.passes)

    def take(self) -> list[KeptPass]:
        passes, self.passes = self.passes, []
        return passes

    def __len__(self) -> int:
        return len(self.passes)


def copy_metadata(cad):
    """A copy of a dataclass of tensors (vLLM's CommonAttentionMetadata, a
    ``view.View``) whose tensors and arrays are copies: the runner's
    persistent buffers behind them are rewritten by the next step (on the
    device after this copy, in stream order; on the host at once). Fields
    marked ``SHARED`` are kept as they are."""

    def copy(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return copy_metadata(value)  # a view inside a view (``SplitView``)
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, np.ndarray):
            return value.copy()
        return value

    return dataclasses.replace(cad, **{
        f.name: copy(getattr(cad, f.name)) for f in dataclasses.fields(cad)
        if f.init and not f.metadata.get("shared")
    })
