"""A step's small host arrays to the device in one copy, without a sync.

The planner decides on the host (lengths are known there without asking the
device) and the view is built on the device, so each step moves a few small
int arrays across. Allocating a tensor per array and copying from pageable
memory would block the host on every step; instead the arrays of a step are
packed into one pinned buffer and copied with a single non-blocking copy into
one persistent device buffer.

Pinned buffers take turns between steps: the host writes one while the copies
out of the others may still be queued. Before reusing a buffer the host checks
the event recorded after its last copy; where that copy has not run yet (the
host ran further ahead than the ring is long: prompt passes kept for a later
step queue tens of ms of draft work before a step's copy), a new buffer joins
the ring instead of the host waiting (up to ``MAX_BUFFERS``, then it waits).
Waiting there would cost the host its lead: under async scheduling a step's
sampled tokens go out only once the host has queued the next step, and
``cudaEventSynchronize`` is invisible to torch's sync debug mode. Within a step each
array gets its own region of the device buffer (a bump allocator reset by
``begin_step``), so a later copy never overwrites data that a kernel queued
after it still reads. Across steps, stream order makes reuse safe.

On CPU there is nothing to copy: arrays become tensors as they are.
Pure torch and numpy; no vLLM.
"""

from __future__ import annotations

import numpy as np
import torch


MAX_BUFFERS = 8
"""Pinned buffers a ring grows to before it waits for the oldest copy (two
suffice while the GPU keeps up)."""


class PinnedRing:
    """Host buffers that take turns as the source of non-blocking copies.

    ``take`` hands out the next buffer whose last copy has run (the event
    ``copied`` recorded after it); where that copy is still queued, a new
    buffer joins the ring at that turn instead, and the ring stays one
    longer. Pure torch; events come from ``new_event`` (CUDA events on a GPU,
    fakes in tests)."""

    def __init__(self, capacity: int, *, pin: bool, new_event,
                 max_buffers: int = MAX_BUFFERS):
        self.capacity, self._pin, self._new_event = capacity, pin, new_event
        self._max = max_buffers
        self.buffers = [self._buffer() for _ in range(2)]
        self._events: list = [None, None]
        self._turn = 0
        self.waits = 0  # turns that waited (the ring at max_buffers)

    @property
    def grown(self) -> int:
        """Buffers added because a copy was still queued."""
        return len(self.buffers) - 2

    def _buffer(self) -> torch.Tensor:
        return torch.empty(self.capacity, dtype=torch.int64, pin_memory=self._pin)

    def resize(self, capacity: int) -> None:
        """New buffers of ``capacity``, as many as before. The old ones stay
        alive through their queued copies (torch's caching host allocator
        keeps a pinned block until the copies that read it ran)."""
        self.capacity = capacity
        self.buffers = [self._buffer() for _ in self.buffers]
        self._events = [None] * len(self.buffers)

    def take(self) -> torch.Tensor:
        """The buffer for this turn's copies, free to write."""
        self._turn = (self._turn + 1) % len(self.buffers)
        event = self._events[self._turn]
        if event is not None and not event.query():
            if len(self.buffers) < self._max:
                self.buffers.insert(self._turn, self._buffer())
                self._events.insert(self._turn, None)
            else:
                self.waits += 1
                event.synchronize()
        return self.buffers[self._turn]

    def copied(self) -> None:
        """Mark the copies queued so far from this turn's buffer."""
        event = self._events[self._turn] = self._new_event()
        event.record()


class HostStaging:
    def __init__(self, device: torch.device, capacity: int = 4096, stats=None):
        self.device = device
        self.stats = stats  # SpecExtendStats: counts staging_waits
        self._gpu = device.type == "cuda"
        self._ring: PinnedRing | None = None
        self._host = torch.zeros(0, dtype=torch.int64)
        self._dev = torch.zeros(0, dtype=torch.int64)
        self._used = 0
        if self._gpu:
            self._ring = PinnedRing(capacity, pin=True, new_event=torch.cuda.Event)
            self._dev = torch.empty(capacity, dtype=torch.int64, device=device)

    def begin_step(self, need: int) -> None:
        """Start a step that copies at most ``need`` int64 values."""
        if self._ring is None:
            return
        if need > self._ring.capacity:
            # Only between steps: no earlier region is still in use.
            capacity = max(need, 2 * self._ring.capacity)
            self._ring.resize(capacity)
            self._dev = torch.empty(capacity, dtype=torch.int64, device=self.device)
        waits = self._ring.waits
        self._host = self._ring.take()
        if self.stats is not None and self._ring.waits > waits:
            self.stats.staging_waits += 1
        self._used = 0

    def to_device(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """int64 device tensors with the values of ``arrays``, copied at once."""
        if not self._gpu:
            return [torch.from_numpy(np.array(a, dtype=np.int64)) for a in arrays]
        sizes = [int(np.size(a)) for a in arrays]
        start = self._used
        end = start + sum(sizes)
        if end > self._ring.capacity:
            raise RuntimeError(
                f"vllm-specextend: staging needs {end} values, begin_step reserved "
                f"{self._ring.capacity}."
            )
        host = self._host.numpy()
        offset = start
        for array, size in zip(arrays, sizes, strict=True):
            host[offset : offset + size] = np.ravel(array)
            offset += size
        dev = self._dev[start:end]
        dev.copy_(self._host[start:end], non_blocking=True)
        self._ring.copied()
        self._used = end
        out, offset = [], 0
        for size in sizes:
            out.append(dev[offset : offset + size])
            offset += size
        return out


def copy_to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without blocking the host: a copy to a GPU
    from pageable memory first waits for the stream's queued work (the
    target's whole forward, half a second at 32K), and a host that waited has
    lost its lead over the GPU, which then idles while the host prepares the
    next kernels. So the copy goes through pinned memory (torch's caching
    host allocator keeps it until the copy ran). For tensors whose size
    varies by step; a step's small arrays go through ``HostStaging``."""
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
