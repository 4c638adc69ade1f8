"""A step's small host arrays to the device in one copy, without a sync.

The planner decides on the host (lengths are known there without asking the
device) and the view is built on the device, so each step moves a few small
int arrays across. Allocating a tensor per array and copying from pageable
memory would block the host on every step; instead the arrays of a step are
packed into one pinned buffer and copied with a single non-blocking copy into
one persistent device buffer.

Two pinned buffers alternate between steps: the host writes one while the copy
out of the other may still be queued. Before reusing a buffer the host checks
the event recorded after its last copy, two steps back; it has always
completed by then in practice, so the check does not wait. Within a step each
array gets its own region of the device buffer (a bump allocator reset by
``begin_step``), so a later copy never overwrites data that a kernel queued
after it still reads. Across steps, stream order makes reuse safe.

On CPU there is nothing to copy: arrays become tensors as they are.
Pure torch and numpy; no vLLM.
"""

from __future__ import annotations

import numpy as np
import torch


class HostStaging:
    def __init__(self, device: torch.device, capacity: int = 4096):
        self.device = device
        self._gpu = device.type == "cuda"
        self._capacity = 0
        self._host: list[torch.Tensor] = []
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._dev = torch.zeros(0, dtype=torch.int64)
        self._turn = 0
        self._used = 0
        if self._gpu:
            self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        # Only between steps (begin_step): no earlier region is still in use.
        self._capacity = capacity
        self._host = [
            torch.empty(capacity, dtype=torch.int64, pin_memory=True) for _ in range(2)
        ]
        self._events = [None, None]
        self._dev = torch.empty(capacity, dtype=torch.int64, device=self.device)

    def begin_step(self, need: int) -> None:
        """Start a step that copies at most ``need`` int64 values."""
        if not self._gpu:
            return
        if need > self._capacity:
            self._allocate(max(need, 2 * self._capacity))
        self._turn ^= 1
        event = self._events[self._turn]
        if event is not None and not event.query():
            event.synchronize()  # the copy of two steps ago; never seen waiting
        self._used = 0

    def to_device(self, *arrays: np.ndarray) -> list[torch.Tensor]:
        """int64 device tensors with the values of ``arrays``, copied at once."""
        if not self._gpu:
            return [torch.from_numpy(np.array(a, dtype=np.int64)) for a in arrays]
        sizes = [int(np.size(a)) for a in arrays]
        start = self._used
        end = start + sum(sizes)
        if end > self._capacity:
            raise RuntimeError(
                f"vllm-specextend: staging needs {end} values, begin_step reserved "
                f"{self._capacity}."
            )
        host = self._host[self._turn].numpy()
        offset = start
        for array, size in zip(arrays, sizes, strict=True):
            host[offset : offset + size] = np.ravel(array)
            offset += size
        dev = self._dev[start:end]
        dev.copy_(self._host[self._turn][start:end], non_blocking=True)
        event = self._events[self._turn] = torch.cuda.Event()
        event.record()
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
