"""Steps the lookup carries (``carry_drafts``): fewer draft forwards.

Why: with ``lookup_tokens`` a step drafts ``r = K - m`` tokens through the
draft model and looks up the last ``m``. On the real pair's copy tasks (K=12,
3 drafted, 9 looked up; an H100, 2026-12-06) a step took ~8.5 ms, about three
of them the draft's three forwards; once a looked-up token holds, the next
ones hold 91-95% of the time, so while an answer copies its prompt the
draft's second and third tokens only repeat what the lookup would propose.
The first forward stays: it writes the draft's KV of the step's verified
tokens, which later steps read.

So a step drafts ``carry_drafts`` tokens (fewer forwards, the lookup the
rest) where every row's last step known to the host accepted a looked-up
token, and ``r`` otherwise: where the copy breaks (an edit, the answer's own
prose) the draft's tokens carry the key past the change, as ``"auto"``'s
measurements found (``config/lookup.py``).

``CarrySignal`` keeps, per request slot on the device, whether its last
verified step accepted a looked-up token (more than the ``r`` it drafted),
and mirrors it to the host without a sync: a non-blocking copy into one of
two pinned buffers after each update, and at the next step the newer of
them whose copy has landed (under async scheduling the host runs about a
step ahead of the GPU: one buffer alone would be rewritten before it is
ever read). So the host knows a row's verification one or two steps late;
a slot's first steps read False. A captured routine cannot branch on device
values here (no conditional graph nodes in torch 2.11: docs/evaluation.md),
so the choice is the host's, and ``draft_capture`` keeps one graph per
draft count.

Shapes: B rows of the step, S request slots. Pure torch; no vLLM.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from vllm_specextend.config.switches import env_count


def carry_after() -> int | None:
    """``SPECEXTEND_CARRY_AFTER=N`` (looked-up tokens, 1 by default) or
    ``all``: how many of a step's looked-up tokens must have been accepted
    for its row to carry (``all``: every proposal of the step, None here). An
    experiment on the real pair (``benchmarks/realpair``): with 1, carried
    steps accepted their second token 0.68 of the time against 0.79 where
    the draft model drafted it (H100, 2026-12-06, 1636Z); read from the
    workers' environment."""
    if os.environ.get("SPECEXTEND_CARRY_AFTER") == "all":
        return None
    return env_count("SPECEXTEND_CARRY_AFTER", 1, 1, unit="looked-up tokens, or all")


_NEVER = 1 << 30
"""A draft count no step reaches: a handed-on slot's until it proposes."""


class CarrySignal:
    """Per request slot: did its last verified step accept enough looked-up
    tokens (``after``: that many, 1 by default; None: every proposal)."""

    def __init__(self, num_slots: int, device: torch.device, after: int | None = 1):
        self.after = after
        self.carried = torch.zeros(num_slots, dtype=torch.bool, device=device)  # [S]
        # Tokens each slot's last proposal drafted (r or carry_drafts). [S]
        self.drafted = torch.zeros(num_slots, dtype=torch.int32, device=device)
        cuda = device.type == "cuda"
        self._host = [torch.zeros(num_slots, dtype=torch.bool, pin_memory=cuda)
                      for _ in range(2)]  # 2 x [S]
        self._events = [torch.cuda.Event() for _ in range(2)] if cuda else None
        self._published = 0  # publications so far; number n went to buffer n % 2
        self._read = -1  # the newest publication read
        # A slot's value counts from this publication on (a new owner). [S]
        self._since = np.zeros(num_slots, dtype=np.int64)
        self.known = np.zeros(num_slots, dtype=bool)  # [S], as last read

    def forget(self, slot: int) -> None:
        """A slot handed to a new request: it starts drafting ``r``, whatever
        copies published before now say."""
        # A slice's fill: ``tensor[i] = False`` is a blocking copy of a CPU
        # scalar in torch 2.11 (it cost every request ~20 ms of first token,
        # the H100 grid of 2026-12-06, 1636Z).
        self.carried[slot : slot + 1].fill_(False)
        # Past any count: its first update carries nothing (no step of its
        # own recorded yet).
        self.drafted[slot : slot + 1].fill_(_NEVER)
        self.known[slot] = False
        self._since[slot] = self._published

    def read(self) -> None:
        """Take the newest published copy that has landed (no sync)."""
        for seq in (self._published - 1, self._published - 2):  # newest first
            if seq <= self._read:
                return
            i = seq % 2
            if self._events is None or self._events[i].query():
                fresh = self._since <= seq
                self.known[fresh] = self._host[i].numpy()[fresh]
                self._read = seq
                return

    def update(self, slots: torch.Tensor, num_spec_tokens: int,
               num_rejected: torch.Tensor) -> None:
        """A uniform decode step's verification: every row verified
        ``num_spec_tokens`` proposals, of which ``num_rejected`` [B] (device)
        were rejected; ``slots`` [B] int64 on the device. Then publish."""
        accepted = num_spec_tokens - num_rejected.to(torch.int32)  # [B]
        if self.after is None:
            carried = accepted == num_spec_tokens
        else:
            carried = accepted >= self.drafted[slots] + self.after
        self.carried.index_copy_(0, slots, carried)
        self._publish()

    def proposed(self, slots: torch.Tensor, drafted: int) -> None:
        """The step's rows drafted ``drafted`` tokens (after ``update``)."""
        self.drafted.index_fill_(0, slots, drafted)

    def carries(self, slots: np.ndarray) -> bool:
        """Every row's last known step accepted a looked-up token."""
        return bool(slots.size) and bool(self.known[slots].all())

    def _publish(self) -> None:
        # Into the older buffer: read() took it already, or a newer one.
        i = self._published % 2
        self._host[i].copy_(self.carried, non_blocking=self._events is not None)
        if self._events is not None:
            self._events[i].record()
        self._published += 1
