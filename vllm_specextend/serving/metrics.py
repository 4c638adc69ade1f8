"""SpecExtend statistics: worker-side counters, a periodic log line, /metrics.

The proposer runs in a worker process, while ``/metrics`` is served by the API
server process, and vLLM has no path for plugin statistics between them. The
worker therefore writes a small JSON snapshot into ``SPECEXTEND_METRICS_DIR``
and the process that resolves the engine config registers a Prometheus
collector that sums the snapshots of all live workers per engine. The
collector is registered only for engines started with ``--spec-extend``, and
its series carry the ``model_name`` and ``engine`` labels of vLLM's own
``vllm:spec_decode_*``.

The directory is private: unless the user names one, the process that resolves
the engine config makes it with ``tempfile.mkdtemp`` (mode 0700, a random
name; inside vLLM's ``PROMETHEUS_MULTIPROC_DIR`` when that is set) and names it
in the environment, which the engine and worker processes inherit; that
process alone removes it, at its exit. Every use opens it without following a
symlink and checks it is a directory of this user with no access for others,
so a name another local user planted or replaced is refused, not written
through. Publishing never raises into the engine: a failure is logged once,
counters keep counting, and a removed directory is made again (mode 0700).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

METRICS_DIR_ENV = "SPECEXTEND_METRICS_DIR"
PROMETHEUS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""vLLM's multiprocess metrics directory (it makes one for several API servers)."""
DIR_PREFIX = "specextend-metrics-"

COUNTERS = {
    "retrievals": "Chunk retrievals (one per scored request).",
    "retrieval_steps": "Draft steps that ran chunk scoring (the scoring layer).",
    "view_rows": "Draft rows that attended through a restricted view.",
    "decode_rows": "Draft rows past prefill.",
    "draft_context_tokens": "Context tokens the draft attended to (decode rows).",
    "full_context_tokens": "Context tokens of the same rows in full.",
    "scoring_seconds": "Time spent scoring and selecting chunks.",
    "compactions": "Rows whose sink and chunk blocks were re-rotated (compacted positions).",
    "compaction_seconds": "Time spent copying and re-rotating those blocks.",
    "graph_steps": "Draft steps that replayed the captured draft routine.",
    "graph_fallbacks": "Draft steps that drafted eagerly although graphs are captured.",
    "deferred_prefill_passes": "Draft passes over prompt chunks run after their step "
                               "(the step sampled nothing).",
    "split_prefill_steps": "Draft steps whose prompt-chunk rows kept their pass "
                           "while the step's other rows drafted.",
    "prefill_window_rows": "Draft rows over prompt chunks that attended to the sinks "
                           "and a window only (draft_prefill_window).",
    "dropped_prefill_passes": "Draft passes over prompt chunks not run: the prompt's "
                              "draft KV comes from its pooled pass (draft_prompt_pool).",
    "pooled_prompt_passes": "Prompts whose draft KV was written for the sinks, the "
                            "pool and the window only (draft_prompt_pool).",
    "pooled_passes_alone": "Pooled prompt passes run in a draft forward of their own "
                           "(the step's first forward could not hold them).",
    "pooled_decode_steps": "Steps ending pooled prompts, any other rows decoding, "
                           "that ran those passes first, then drafted as a decode "
                           "step.",
}
GAUGES = {
    "tracked_requests": "Requests holding SpecExtend selection state.",
    # A slot outlives its selection (prefill, a refresh due): a slot a finished
    # request never gave back leaks its buffers and scratch run unseen above.
    "request_slots": "Request slots held (selection buffers and, with "
                     "compacted positions, a scratch KV run each).",
}
LABELS = ["model_name", "engine"]
ENGINE_KEY = "engine"
"""Snapshot field naming the worker's engine (its data-parallel rank)."""

Warn = Callable[[str], None]


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
    graph_steps: int = 0
    graph_fallbacks: int = 0
    deferred_prefill_passes: int = 0
    split_prefill_steps: int = 0
    prefill_window_rows: int = 0
    dropped_prefill_passes: int = 0
    pooled_prompt_passes: int = 0
    pooled_passes_alone: int = 0
    pooled_decode_steps: int = 0
    tracked_requests: int = 0
    request_slots: int = 0
    _pending: list = field(default_factory=list, repr=False)

    def start_timer(self, device: torch.device):
        if device.type == "cuda":
            import torch  # only the GPU timers: the metrics directory needs none

            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    def stop_timer(self, start, counter: str = "scoring_seconds") -> None:
        if isinstance(start, float):
            setattr(self, counter, getattr(self, counter) + time.perf_counter() - start)
            return
        import torch  # a GPU timer (start_timer says why here)

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
        # Not asdict(): it deep-copies every field, the pending CUDA events too,
        # and an event cannot be copied (TypeError inside an engine step).
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not f.name.startswith("_")}


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
    replays = delta.get("graph_steps", 0)
    eager = delta.get("graph_fallbacks", 0)
    # Only where graphs are captured (a count moved): why eager is logged once
    # per reason by the proposer.
    graphs = (f"draft graph: {replays}/{replays + eager} steps, "
              if replays or eager else "")
    return (
        f"SpecExtend metrics: retrievals: {delta['retrievals']}, "
        f"view rows: {delta['view_rows']}/{delta['decode_rows']}, "
        f"draft context: {share:.1f}% of full, "
        f"scoring: {per:.3f} ms/step, "
        f"{compaction}{graphs}"
        f"tracked requests: {now['tracked_requests']}"
    )


class UnsafeMetricsDir(OSError):
    """The metrics directory is not one only this user can read and write."""


_warned: set[str] = set()


def _warn_once(warn: Warn | None, key: str, message: str) -> None:
    """Log ``message`` unless this process already warned about ``key`` (a
    directory and a kind of trouble): a failure that lasts would otherwise
    repeat every interval."""
    if key in _warned:
        return
    _warned.add(key)
    (warn or logging.getLogger(__name__).warning)(message)


def open_private_dir(path: Path, create: bool = False) -> int:
    """A descriptor of directory ``path`` once checked private: not a symlink,
    owned by this user, no permission bits for group or others (0700).
    ``create``: make a missing ``path`` first (mode 0700, its parent must
    exist). Raises ``UnsafeMetricsDir`` (its message names the fix), or
    ``OSError``: ``FileNotFoundError`` when it is missing."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    # lstat only words the refusal; the checks that count are on what was opened.
    if stat.S_ISLNK(os.lstat(path).st_mode):
        raise UnsafeMetricsDir(
            f"{path} is a symlink, which is not followed: point "
            f"{METRICS_DIR_ENV} at a directory of your own with mode 0700, or "
            "unset it so that the plugin makes a private one"
        )
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except NotADirectoryError:
        raise UnsafeMetricsDir(
            f"{path} is not a directory: remove it, or point {METRICS_DIR_ENV} at "
            "a directory of your own with mode 0700"
        ) from None
    try:
        _check_private(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_private(path: Path, st: os.stat_result) -> None:
    uid = os.geteuid()
    if st.st_uid != uid:
        raise UnsafeMetricsDir(
            f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid}), "
            f"who could forge or read its snapshots: point {METRICS_DIR_ENV} at a "
            "directory of your own with mode 0700, or unset it"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise UnsafeMetricsDir(
            f"{path} has mode {mode:04o}, so other users could forge or read its "
            f"snapshots: chmod 700 {path}"
        )


def metrics_dir() -> Path | None:
    """The snapshot directory named for this process tree, if any (unchecked)."""
    path = os.environ.get(METRICS_DIR_ENV)
    return Path(path) if path else None


_own_dirs: dict[Path, int] = {}
"""Directories ``ensure_metrics_dir`` made: {path: pid of the process that did}."""


def ensure_metrics_dir(warn: Warn | None = None) -> Path | None:
    """Where this process tree publishes, before its engine processes start.

    A directory named in ``SPECEXTEND_METRICS_DIR`` is the user's: it is made
    if missing, checked, and never removed; a refused one is returned (and
    warned about once) so that readers and writers keep refusing it, and the
    engine runs without publishing. Otherwise a private one is made, named in
    the environment for the engine and worker processes, and removed when this
    process exits. None when none could be made.
    """
    named = metrics_dir()
    if named is not None:
        try:
            os.close(open_private_dir(named, create=True))
        except OSError as e:
            _warn_not_published(warn, named, e)
        return named
    parents = [os.environ.get(PROMETHEUS_DIR_ENV) or None, None]
    for parent in dict.fromkeys(parents):
        try:
            path = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=parent))
            break
        except OSError as e:
            error = e
    else:
        _warn_once(
            warn, "mkdtemp",
            f"SpecExtend metrics: cannot make a private snapshot directory "
            f"({error}); vllm:spec_extend_* stay off /metrics, the engine runs "
            f"on. Fix: make TMPDIR writable, or set {METRICS_DIR_ENV} to a "
            "directory of your own with mode 0700.",
        )
        return None
    os.environ[METRICS_DIR_ENV] = str(path)
    if not _own_dirs:
        atexit.register(remove_own_dirs)
    _own_dirs[path] = os.getpid()
    return path


def remove_own_dirs() -> None:
    """At exit: remove the directories this process made, once their writers
    have exited. A forked child inherits the exit handler but not the
    directory; one a writer still publishes to, or one no longer ours, stays."""
    for path, pid in list(_own_dirs.items()):
        if pid != os.getpid():
            continue
        del _own_dirs[path]
        try:
            fd = open_private_dir(path)
        except OSError:
            continue
        try:
            names = os.listdir(fd)
            writers = {_writer_pid(name) for name in names} - {None, os.getpid()}
            if any(_alive(writer) for writer in writers):
                continue
            for name in names:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(path)


def _warn_not_published(warn: Warn | None, directory: Path, error: Exception) -> None:
    kind = type(error).__name__
    _warn_once(
        warn, f"{directory}: {kind}",
        f"SpecExtend metrics: not publishing to {directory}: {kind}: {error}. "
        "vllm:spec_extend_* on /metrics miss these counts until it is usable "
        "again (checked at every report and scrape); counters keep counting "
        "and the engine runs on.",
    )


def _writer_pid(name: str) -> int | None:
    """The pid in a snapshot's name (``worker-<pid>.json`` or ``.tmp``)."""
    stem, _, suffix = name.partition(".")
    kind, _, pid = stem.partition("-")
    if kind != "worker" or suffix not in ("json", "tmp") or not pid.isdigit():
        return None
    return int(pid)


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
            _warn_once(self.warn, f"report: {type(e).__name__}",
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
            made = _write_snapshot(self.path, data)
        # Any failure: it runs inside an engine step, which must go on.
        except Exception as e:
            _warn_not_published(self.warn, directory, e)
            return
        if made:
            _warn_once(
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


def _write_snapshot(path: Path, data: bytes) -> bool:
    """Replace snapshot ``path`` by ``data`` inside its checked directory;
    True when the directory was missing and made again."""
    try:
        fd = open_private_dir(path.parent)
        made = False
    except FileNotFoundError:
        fd = open_private_dir(path.parent, create=True)
        made = True
    try:
        tmp = path.with_suffix(".tmp").name
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(tmp, flags, 0o600, dir_fd=fd), "wb") as f:
            f.write(data)
        os.replace(tmp, path.name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
    return made


def _read_snapshot(dir_fd: int, name: str) -> dict | None:
    """A live worker's snapshot in the directory open as ``dir_fd``."""
    pid = _writer_pid(name)
    # A worker that died without cleaning up no longer counts.
    if pid is None or not name.endswith(".json") or not _alive(pid):
        return None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with os.fdopen(os.open(name, flags, dir_fd=dir_fd), "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):  # gone meanwhile, or not ours to read
        return None
    return data if isinstance(data, dict) else None


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
                return [d for n in names if (d := _read_snapshot(fd, n)) is not None]
            finally:
                os.close(fd)
        except FileNotFoundError:
            return []
        except OSError as e:
            _warn_not_published(self.warn, self.directory, e)
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
