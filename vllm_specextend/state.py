"""Per-request selection state, with an explicit lifecycle.

An entry is created when a request first needs a restricted view, reset when
the request (re)enters prefill (new request, preemption + recompute, a reused
request id), and dropped when the scheduler reports it finished or aborted.
``sweep`` is only a backstop for ids the worker never hears about again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class RequestSelection:
    """What the draft keeps of one request until the next retrieval."""

    window_start: int
    """First token of the recent window (chunk-aligned)."""
    num_selected: int = 0
    """Retrieved chunks in use (0 for ``streaming``)."""
    selected_chunks: torch.Tensor | None = None
    """[k] int32 chunk ids on the device, the first ``num_selected`` valid."""
    steps_since_refresh: int = 0
    compacted: bool = False
    """Its scratch blocks hold this selection's re-rotated copies."""


class SelectionStore:
    """req_id -> RequestSelection."""

    def __init__(self) -> None:
        self._entries: dict[str, RequestSelection] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(list(self._entries))

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._entries

    def get(self, req_id: str) -> RequestSelection | None:
        return self._entries.get(req_id)

    def put(self, req_id: str, entry: RequestSelection) -> None:
        self._entries[req_id] = entry

    def drop(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            self._entries.pop(req_id, None)

    def sweep(self, live_req_ids: Iterable[str]) -> int:
        """Drop entries of requests the runner no longer knows; returns count."""
        live = set(live_req_ids)
        stale = [r for r in self._entries if r not in live]
        self.drop(stale)
        return len(stale)
