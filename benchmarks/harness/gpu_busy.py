"""GPU busy share over a run's decode window, from NVML samples.

NVML's ``utilization.gpu`` is the share of the last sample period during which
at least one kernel ran; below 100% during decoding the GPU waited for the
host. A thread samples it every ``interval_s``, stamped by ``clock``: the
clock of the token timestamps the samples are matched with, so the samples
inside a run's decode intervals (each request's [first token, last token])
give the run's busy share. ``time.monotonic`` (the default) is the clock of
vLLM's engine-core timestamps (``bench_decode``); ``time.perf_counter`` that of
``vllm bench serve``'s per-request times (``bench_serve``; on Linux both read
CLOCK_MONOTONIC, one clock for every process of the host, so a client in
another process stamps on it too). ``None`` where NVML is missing (CPU hosts).

NVML numbers a host's GPUs whatever ``CUDA_VISIBLE_DEVICES`` says, so the
indexes a process uses (its visible devices) are mapped to NVML's first
(``nvml_devices``): a bench on the second GPU of a host read the first's
busy share on 2026-11-28.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable


def _nvml():
    try:
        from vllm.third_party import pynvml  # vLLM's bundled copy
    except ImportError:
        try:
            import pynvml
        except ImportError:
            return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: a CPU host
        return None
    return pynvml


def nvml_devices(device_indexes: Iterable[int],
                 visible: str | None = None) -> list[int | str]:
    """NVML's index (or UUID) of each visible device index.

    ``visible``: ``CUDA_VISIBLE_DEVICES`` (read from the environment when
    None); unset or empty, the indexes stand as they are. Indexes are taken
    in NVML's (PCI bus) order, CUDA's own on hosts of one GPU model; a UUID
    must be whole (CUDA also takes a prefix, NVML does not)."""
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [v.strip() for v in (visible or "").split(",") if v.strip()]
    if not names:
        return list(device_indexes)
    out: list[int | str] = []
    for i in device_indexes:
        if i >= len(names):
            raise ValueError(f"device {i} is not visible (CUDA_VISIBLE_DEVICES={visible})")
        out.append(int(names[i]) if names[i].isdigit() else names[i])
    return out


class GpuBusy:
    """``with GpuBusy() as busy: ...`` then ``busy.share(intervals)``."""

    def __init__(self, device_indexes: Iterable[int] = (0,), interval_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic):
        self.interval_s = interval_s
        self.clock = clock
        # (clock s, busy 0..1 of each device, in device_indexes' order)
        self.samples: list[tuple[float, list[float]]] = []
        self._nvml = _nvml()
        self._handles = []
        if self._nvml is not None:
            self._handles = [
                self._nvml.nvmlDeviceGetHandleByIndex(d) if isinstance(d, int)
                else self._nvml.nvmlDeviceGetHandleByUUID(d)
                for d in nvml_devices(device_indexes)]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return bool(self._handles)

    def __enter__(self) -> GpuBusy:
        if self.available:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            rates = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0
                     for h in self._handles]
            self.samples.append((self.clock(), rates))
            self._stop.wait(self.interval_s)

    def per_device(self, intervals: Iterable[tuple[float, float]]) -> list[float] | None:
        """Each device's mean busy share over the samples inside any of
        ``intervals`` (``clock`` seconds); None without samples there."""
        intervals = list(intervals)
        inside = [rates for t, rates in self.samples
                  if any(start <= t <= end for start, end in intervals)]
        if not inside:
            return None
        return [sum(column) / len(inside) for column in zip(*inside, strict=True)]

    def share(self, intervals: Iterable[tuple[float, float]]) -> float | None:
        """Mean busy share of all devices over ``intervals``; None without
        samples there."""
        shares = self.per_device(intervals)
        return None if shares is None else sum(shares) / len(shares)
