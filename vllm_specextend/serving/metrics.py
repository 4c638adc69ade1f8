"""SpecExtend statistics on /metrics and in the log: the reporter and the collector.

The proposer runs in a worker process, while ``/metrics`` is served by the API
server process, and vLLM has no path for plugin statistics between them. The
worker's ``StatsReporter`` therefore writes a small JSON snapshot of its
counters (``stats``) into ``SPECEXTEND_METRICS_DIR`` (``snapshots``) and logs a
line every interval; the process that resolves the engine config registers a
Prometheus collector (``SnapshotCollector``) that sums the snapshots of all
live workers per engine. The collector is registered only for engines started
with ``--spec-extend``, and its series carry the ``model_name`` and ``engine``
labels of vLLM's own ``vllm:spec_decode_*``. Publishing never raises into the
engine: a failure is logged once, counters keep counting, and a removed
directory is made again (mode 0700).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from vllm_specextend.serving.snapshots import (
    METRICS_DIR_ENV,
    Warn,
    ensure_metrics_dir,
    metrics_dir,
    open_private_dir,
    read_snapshot,
    warn_not_published,
    warn_once,
    write_snapshot,
)
from vllm_specextend.serving.stats import COUNTERS, GAUGES, SpecExtendStats, format_line

LABELS = ["model_name", "engine"]
ENGINE_KEY = "engine"
"""Snapshot field naming the worker's engine (its data-parallel rank)."""


class StatsReporter:
    """Writes snapshots for /metrics and logs a line every interval.

    With ``publish=False`` (tensor-parallel ranks but the first, which see the
    same rows) it only keeps the interval, so callers' periodic work still runs.
    ``engine``: the engine's ``engine`` label (``Settings.engine_index``).
    ``warn``: where a publishing failure is logged, once.
    """

    def __init__(
        self,
        stats: SpecExtendStats,
        interval_s: float,
        log,
        publish: bool = True,
        engine: int = 0,
        warn: Warn | None = None,
    ) -> None:
        self.stats = stats
        self.interval_s = interval_s
        self.log = log
        self.warn = warn
        self.engine = engine
        self.publish = publish
        # No directory named: no collector reads one, only the log line is kept.
        directory = metrics_dir() if publish else None
        self.path = directory / f"worker-{os.getpid()}.json" if directory else None
        if self.path is not None:
            atexit.register(self.close)
        self._last_time = time.monotonic()
        self._last = stats.snapshot(wait=False)

    def due(self) -> bool:
        return time.monotonic() - self._last_time >= self.interval_s

    def maybe_report(self, force: bool = False) -> None:
        """A report every ``interval_s``, and one whenever ``force``d (the
        batch emptied). A forced report leaves the interval's clock alone:
        when batches empty more often than the interval, resetting it would
        leave only the idle moments published, and /metrics would show no
        tracked request while requests run."""
        due = self.due()
        if not force and not due:
            return
        # It runs inside an engine step, which must go on whatever the report
        # does: a failure is logged once and the counters keep counting.
        try:
            self._report(periodic=due)
        except Exception as e:
            self._last_time = time.monotonic()
            warn_once(self.warn, f"report: {type(e).__name__}",
                       f"SpecExtend metrics: a report failed ({type(e).__name__}: "
                       f"{e}); the engine goes on, this report is skipped.")

    def _report(self, periodic: bool = True) -> None:
        if periodic:
            self._last_time = time.monotonic()
        if not self.publish:
            return
        now = self.stats.snapshot(wait=False)
        delta = {k: now[k] - self._last[k] for k in COUNTERS}
        if delta["decode_rows"] or delta["retrievals"]:
            self.log(format_line(delta, now))
        self._last = now
        if self.path is not None:
            self._publish(now)

    def _publish(self, snapshot: dict) -> None:
        directory = self.path.parent
        data = json.dumps({**snapshot, ENGINE_KEY: self.engine}).encode()
        try:
            made = write_snapshot(self.path, data)
        # Any failure: it runs inside an engine step, which must go on.
        except Exception as e:
            warn_not_published(self.warn, directory, e)
            return
        if made:
            warn_once(
                self.warn, f"{directory}: made",
                f"SpecExtend metrics: {directory} was missing; made it again "
                "(mode 0700) and published. Something removes it while the "
                "engine runs (a temp-directory cleaner, or the process that "
                f"made it exited before its engine); set {METRICS_DIR_ENV} to a "
                "directory of your own with mode 0700 to keep snapshots there.",
            )

    def close(self) -> None:
        if self.path is None:
            return
        # At exit: whatever became of the directory, exiting must not fail.
        with contextlib.suppress(OSError):
            fd = open_private_dir(self.path.parent)
            try:
                for name in (self.path.name, self.path.with_suffix(".tmp").name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=fd)
            finally:
                os.close(fd)


class SnapshotCollector:
    """Prometheus collector summing the workers' snapshots per engine.

    ``engines``: the engines the serving process fronts; each gets a series
    (0 until its workers publish), as vLLM's own counters do. While the
    directory is refused or unreadable the series are left out (logged once
    through ``warn``): a scrape never fails because of them.
    """

    def __init__(
        self,
        directory: Path,
        model_name: str = "",
        engines: Iterable[int] = (0,),
        warn: Warn | None = None,
    ) -> None:
        self.directory = directory
        self.model_name = model_name
        self.engines = tuple(engines)
        self.warn = warn

    def _snapshots(self) -> list[dict] | None:
        """The live workers' snapshots; None when the directory is refused or
        unreadable. A missing directory has none yet."""
        try:
            fd = open_private_dir(self.directory)
            try:
                names = os.listdir(fd)
                return [d for n in names if (d := read_snapshot(fd, n)) is not None]
            finally:
                os.close(fd)
        except FileNotFoundError:
            return []
        except OSError as e:
            warn_not_published(self.warn, self.directory, e)
            return None

    def _totals(self, snapshots: list[dict]) -> dict[int, dict]:
        keys = [*COUNTERS, *GAUGES]
        totals = {e: dict.fromkeys(keys, 0) for e in self.engines}
        for data in snapshots:
            engine = data.get(ENGINE_KEY, 0)
            total = totals.setdefault(
                engine if isinstance(engine, int) else 0, dict.fromkeys(keys, 0)
            )
            for key in keys:
                value = data.get(key, 0)
                if isinstance(value, (int, float)):
                    total[key] += value
        return totals

    def read_engines(self) -> dict[int, dict]:
        """{engine: {counter or gauge: sum over its live workers}}; zeros while
        the directory is refused."""
        return self._totals(self._snapshots() or [])

    def read(self) -> dict:
        """All engines summed."""
        total = dict.fromkeys([*COUNTERS, *GAUGES], 0)
        for per_engine in self.read_engines().values():
            for key in total:
                total[key] += per_engine[key]
        return total

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snapshots = self._snapshots()
        if snapshots is None:
            return
        engines = self._totals(snapshots)
        kinds = ((CounterMetricFamily, COUNTERS), (GaugeMetricFamily, GAUGES))
        for kind, table in kinds:
            for key, doc in table.items():
                family = kind(f"vllm:spec_extend_{key}", doc, labels=LABELS)
                for engine, total in sorted(engines.items()):
                    family.add_metric([self.model_name, str(engine)], total[key])
                yield family


_COLLECTOR: SnapshotCollector | None = None


def install_collector(
    model_name: str, engines: Iterable[int] = (0,), warn: Warn | None = None
) -> None:
    """Register the collector in this process's default registry, once: the
    first engine config with ``--spec-extend`` names its labels. Also names
    the snapshot directory (``ensure_metrics_dir``) for the engine processes
    started after it; without one there is nothing to collect."""
    global _COLLECTOR
    if _COLLECTOR is not None:
        return
    directory = ensure_metrics_dir(warn)
    if directory is None:
        return
    from prometheus_client import REGISTRY

    _COLLECTOR = SnapshotCollector(directory, model_name, engines, warn)
    REGISTRY.register(_COLLECTOR)


def uninstall_collector() -> None:
    global _COLLECTOR
    if _COLLECTOR is None:
        return
    from prometheus_client import REGISTRY

    REGISTRY.unregister(_COLLECTOR)
    _COLLECTOR = None
