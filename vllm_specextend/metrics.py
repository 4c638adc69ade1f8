"""SpecExtend statistics: worker-side counters, a periodic log line, /metrics.

The proposer runs in a worker process, while ``/metrics`` is served by the API
server process, and vLLM has no path for plugin statistics between them. The
worker therefore writes a small JSON snapshot into ``SPECEXTEND_METRICS_DIR``
(named by the process that resolves the engine config, inherited by the engine
and worker processes) and that process registers a Prometheus collector that
sums the snapshots of all live workers per engine. The collector is registered
only for engines started with ``--spec-extend``, and its series carry the
``model_name`` and ``engine`` labels of vLLM's own ``vllm:spec_decode_*``.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

METRICS_DIR_ENV = "SPECEXTEND_METRICS_DIR"

COUNTERS = {
    "retrievals": "Chunk retrievals (one per scored request).",
    "retrieval_steps": "Draft steps that ran final-layer scoring.",
    "view_rows": "Draft rows that attended through a restricted view.",
    "decode_rows": "Draft rows past prefill.",
    "draft_context_tokens": "Context tokens the draft attended to (decode rows).",
    "full_context_tokens": "Context tokens of the same rows in full.",
    "scoring_seconds": "Time spent scoring and selecting chunks.",
    "compactions": "Rows whose sink and chunk blocks were re-rotated (compacted positions).",
    "compaction_seconds": "Time spent copying and re-rotating those blocks.",
}
GAUGES = {"tracked_requests": "Requests holding SpecExtend selection state."}
LABELS = ["model_name", "engine"]
ENGINE_KEY = "engine"
"""Snapshot field naming the worker's engine (its data-parallel rank)."""


@dataclass
class SpecExtendStats:
    retrievals: int = 0
    retrieval_steps: int = 0
    view_rows: int = 0
    decode_rows: int = 0
    draft_context_tokens: int = 0
    full_context_tokens: int = 0
    scoring_seconds: float = 0.0
    compactions: int = 0
    compaction_seconds: float = 0.0
    tracked_requests: int = 0
    _pending: list = field(default_factory=list, repr=False)

    def start_timer(self, device: torch.device):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    def stop_timer(self, start, counter: str = "scoring_seconds") -> None:
        if isinstance(start, float):
            setattr(self, counter, getattr(self, counter) + time.perf_counter() - start)
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        # Read later: elapsed_time now would stall the step on the GPU.
        self._pending.append((start, end, counter))

    def resolve_timers(self, wait: bool = False) -> None:
        """Add the device timers whose events have completed to their counters.

        The others stay pending for a later call: waiting for them would drain
        an async-scheduled pipeline once per log interval. ``wait``: wait for
        all of them (a complete count, for an RPC or a benchmark).
        """
        pending = []
        for start, end, counter in self._pending:
            if wait:
                end.synchronize()
            elif not (end.query() and start.query()):
                pending.append((start, end, counter))
                continue
            seconds = start.elapsed_time(end) / 1000.0
            setattr(self, counter, getattr(self, counter) + seconds)
        self._pending = pending

    def snapshot(self, wait: bool = True) -> dict:
        """The counters and gauges. ``wait=False`` (the periodic reporter)
        leaves device timers that are still running for a later snapshot."""
        self.resolve_timers(wait=wait)
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def format_line(delta: dict, now: dict) -> str:
    full = delta["full_context_tokens"]
    share = 100.0 * delta["draft_context_tokens"] / full if full else 100.0
    per = (
        1000.0 * delta["scoring_seconds"] / delta["retrieval_steps"]
        if delta["retrieval_steps"]
        else 0.0
    )
    compaction = (
        f"compaction: {1000.0 * delta['compaction_seconds'] / delta['compactions']:.3f}"
        " ms/row, "
        if delta.get("compactions")
        else ""
    )
    return (
        f"SpecExtend metrics: retrievals: {delta['retrievals']}, "
        f"view rows: {delta['view_rows']}/{delta['decode_rows']}, "
        f"draft context: {share:.1f}% of full, "
        f"scoring: {per:.3f} ms/step, "
        f"{compaction}"
        f"tracked requests: {now['tracked_requests']}"
    )


def metrics_dir() -> Path:
    """The snapshot directory of this process tree (created by the writer).

    The first process that loads the plugin names it and removes it at exit;
    engine and worker processes inherit the name through the environment.
    """
    path = os.environ.get(METRICS_DIR_ENV)
    if not path:
        path = os.path.join(tempfile.gettempdir(), f"specextend-metrics-{os.getpid()}")
        os.environ[METRICS_DIR_ENV] = path
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return Path(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    return True


class StatsReporter:
    """Writes snapshots for /metrics and logs a line every interval.

    With ``publish=False`` (tensor-parallel ranks but the first, which see the
    same rows) it only keeps the interval, so callers' periodic work still runs.
    ``engine``: the engine's ``engine`` label (``Settings.engine_index``).
    """

    def __init__(
        self,
        stats: SpecExtendStats,
        interval_s: float,
        log,
        publish: bool = True,
        engine: int = 0,
    ) -> None:
        self.stats = stats
        self.interval_s = interval_s
        self.log = log
        self.engine = engine
        self.path = metrics_dir() / f"worker-{os.getpid()}.json" if publish else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atexit.register(self.close)
        self._last_time = time.monotonic()
        self._last = stats.snapshot(wait=False)

    def due(self) -> bool:
        return time.monotonic() - self._last_time >= self.interval_s

    def maybe_report(self, force: bool = False) -> None:
        if not force and not self.due():
            return
        now_t = time.monotonic()
        if self.path is None:
            self._last_time = now_t
            return
        now = self.stats.snapshot(wait=False)
        delta = {k: now[k] - self._last[k] for k in COUNTERS}
        if delta["decode_rows"] or delta["retrievals"]:
            self.log(format_line(delta, now))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**now, ENGINE_KEY: self.engine}))
        tmp.replace(self.path)
        self._last, self._last_time = now, now_t

    def close(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)


class SnapshotCollector:
    """Prometheus collector summing the workers' snapshots per engine.

    ``engines``: the engines the serving process fronts; each gets a series
    (0 until its workers publish), as vLLM's own counters do.
    """

    def __init__(
        self, directory: Path, model_name: str = "", engines: Iterable[int] = (0,)
    ) -> None:
        self.directory = directory
        self.model_name = model_name
        self.engines = tuple(engines)

    def read_engines(self) -> dict[int, dict]:
        """{engine: {counter or gauge: sum over its live workers}}."""
        totals = {e: dict.fromkeys([*COUNTERS, *GAUGES], 0) for e in self.engines}
        for path in self.directory.glob("worker-*.json"):
            # A worker that died without cleaning up no longer counts.
            if not _alive(int(path.stem.split("-")[1])):
                continue
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            engine = int(data.get(ENGINE_KEY, 0))
            total = totals.setdefault(engine, dict.fromkeys([*COUNTERS, *GAUGES], 0))
            for key in total:
                total[key] += data.get(key, 0)
        return totals

    def read(self) -> dict:
        """All engines summed."""
        total = dict.fromkeys([*COUNTERS, *GAUGES], 0)
        for per_engine in self.read_engines().values():
            for key in total:
                total[key] += per_engine[key]
        return total

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        engines = self.read_engines()
        kinds = ((CounterMetricFamily, COUNTERS), (GaugeMetricFamily, GAUGES))
        for kind, table in kinds:
            for key, doc in table.items():
                family = kind(f"vllm:spec_extend_{key}", doc, labels=LABELS)
                for engine, total in sorted(engines.items()):
                    family.add_metric([self.model_name, str(engine)], total[key])
                yield family


_COLLECTOR: SnapshotCollector | None = None


def install_collector(model_name: str, engines: Iterable[int] = (0,)) -> None:
    """Register the collector in this process's default registry, once: the
    first engine config with ``--spec-extend`` names its labels."""
    global _COLLECTOR
    if _COLLECTOR is not None:
        return
    from prometheus_client import REGISTRY

    _COLLECTOR = SnapshotCollector(metrics_dir(), model_name, engines)
    REGISTRY.register(_COLLECTOR)


def uninstall_collector() -> None:
    global _COLLECTOR
    if _COLLECTOR is None:
        return
    from prometheus_client import REGISTRY

    REGISTRY.unregister(_COLLECTOR)
    _COLLECTOR = None
