"""Per-request selection state in persistent buffers, one slot per live request.

A request gets a slot the first time it appears in a batch and keeps it until
the scheduler reports it finished, aborted or preempted (``release``); ``sweep``
is only a backstop for ids the worker never hears about again. Everything a
step decides with is indexed by slot: the CPU arrays hold what the planner
reads without a device sync (lengths, counts), the device buffer holds the
chosen chunk ids, which never leave the device. A slot also names the
request's run of scratch blocks under compacted positions.

Batch rows map to slots through ``slots_for(req_ids)``; while the batch keeps
its requests in the same rows (most decode steps) that mapping is reused, host
and device copies alike, so a steady step does no per-request Python.

A selection's lifecycle: ``clear`` when the request (re)enters prefill or its
refresh is due, ``put`` when a new one is chosen (``window_start`` and
``num_selected`` here, chunk ids in ``selected_chunks``), ``compacted`` once its
scratch copies are written.

Pure torch and numpy; no vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch

from vllm_specextend.retrieval.staging import HostStaging


class SelectionState:
    """req_id -> slot, and per-slot selections."""

    def __init__(self, num_slots: int, top_k: int, device: torch.device,
                 live_req_ids: Callable[[], Iterable[str]] | None = None):
        self.num_slots = num_slots
        self.device = device
        self._live_req_ids = live_req_ids
        self._slot_of: dict[str, int] = {}
        self._free = list(range(num_slots - 1, -1, -1))
        # What the planner reads, on the host: [num_slots] each.
        self.active = np.zeros(num_slots, dtype=bool)  # holds a selection
        self.window_start = np.zeros(num_slots, dtype=np.int64)
        self.num_selected = np.zeros(num_slots, dtype=np.int64)
        self.steps_since_refresh = np.zeros(num_slots, dtype=np.int64)
        self.compacted = np.zeros(num_slots, dtype=bool)
        # Chunk ids per slot, the first num_selected[slot] valid, in document
        # order; only the device has them. [num_slots, top_k] int32
        self.selected_chunks = torch.zeros(
            num_slots, max(top_k, 1), dtype=torch.int32, device=device
        )
        self._batch_ids: list[str] | None = None
        self._batch_slots = np.zeros(0, dtype=np.int64)
        self._batch_slots_buf = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self._batch_slots_dev = self._batch_slots_buf[:0]

    def __len__(self) -> int:
        """Requests holding a selection."""
        return int(self.active.sum())

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._slot_of

    def __iter__(self):
        """Requests holding a slot, with or without a selection."""
        return iter(list(self._slot_of))

    @property
    def num_slots_held(self) -> int:
        return len(self._slot_of)

    def slots_for(self, req_ids: list[str], staging: HostStaging | None = None
                  ) -> tuple[np.ndarray, torch.Tensor]:
        """Slots of a batch's rows: ([num_reqs] int64 host, the same on the
        device). Reused while the rows hold the same requests; a new mapping
        reaches the device through ``staging`` (no sync) when given."""
        if req_ids != self._batch_ids:
            slots = np.fromiter(
                (self._slot(r) for r in req_ids), dtype=np.int64, count=len(req_ids)
            )
            self._batch_ids = list(req_ids)
            self._batch_slots = slots
            dev = self._batch_slots_buf[: slots.size]
            if staging is None:
                dev.copy_(torch.from_numpy(slots))
            else:
                dev.copy_(staging.to_device(slots)[0])
            self._batch_slots_dev = dev
        return self._batch_slots, self._batch_slots_dev

    def _slot(self, req_id: str) -> int:
        slot = self._slot_of.get(req_id)
        if slot is None:
            if not self._free and self._live_req_ids is not None:
                # Finished ids arrive before the step that reuses their slots;
                # this only catches ids the worker never heard about.
                self.sweep(self._live_req_ids())
            if not self._free:
                raise RuntimeError(
                    f"vllm-specextend: all {self.num_slots} request slots are "
                    "taken; a finished request was never released."
                )
            slot = self._slot_of[req_id] = self._free.pop()
            self.clear([slot])
        return slot

    def slot_of(self, req_id: str) -> int | None:
        return self._slot_of.get(req_id)

    def clear(self, slots) -> None:
        """Forget the selections of ``slots`` (prefill, refresh due)."""
        self.active[slots] = False
        self.compacted[slots] = False
        self.steps_since_refresh[slots] = 0
        self.num_selected[slots] = 0

    def put(
        self,
        slots: np.ndarray,
        window_start: np.ndarray,
        num_selected: np.ndarray,
        chunks: torch.Tensor | None = None,
        slots_dev: torch.Tensor | None = None,
    ) -> None:
        """New selections for ``slots`` ([n] each): ``chunks`` [n, k <= top_k]
        on the device (None for streaming windows), rows by ``slots_dev``."""
        self.active[slots] = True
        self.compacted[slots] = False
        self.steps_since_refresh[slots] = 0
        self.window_start[slots] = window_start
        self.num_selected[slots] = num_selected
        if chunks is not None and chunks.shape[1] > 0:
            target = self.selected_chunks[:, : chunks.shape[1]]
            target.index_copy_(0, slots_dev, chunks.to(torch.int32))

    def selection(self, req_id: str) -> tuple[int, list[int], int] | None:
        """(window_start, chunk ids, steps since refresh) of a request; for
        tests and debugging (reads the device)."""
        slot = self._slot_of.get(req_id)
        if slot is None or not self.active[slot]:
            return None
        n = int(self.num_selected[slot])
        chunks = self.selected_chunks[slot, :n].tolist()
        return int(self.window_start[slot]), chunks, int(self.steps_since_refresh[slot])

    def release(self, req_ids: Iterable[str]) -> None:
        """Finished, aborted or preempted: free their slots."""
        freed = False
        for req_id in req_ids:
            slot = self._slot_of.pop(req_id, None)
            if slot is not None:
                self.clear([slot])
                self._free.append(slot)
                freed = True
        if freed:
            self._batch_ids = None  # a freed slot may be handed out again

    def sweep(self, live_req_ids: Iterable[str]) -> int:
        """Release ids the runner no longer knows; returns their count."""
        live = set(live_req_ids)
        stale = [r for r in self._slot_of if r not in live]
        self.release(stale)
        return len(stale)

    def reset(self) -> None:
        """Drop every selection (slots stay assigned)."""
        self.clear(slice(None))
