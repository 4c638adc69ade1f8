"""SpecExtend statistics: timers, log line, snapshots and /metrics (no vLLM)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import types

import pytest
import torch

from vllm_specextend.serving import metrics, snapshots
from vllm_specextend.serving import stats as stats_mod
from vllm_specextend.serving.metrics import SnapshotCollector, StatsReporter
from vllm_specextend.serving.snapshots import (
    DIR_PREFIX,
    METRICS_DIR_ENV,
    PROMETHEUS_DIR_ENV,
)
from vllm_specextend.serving.stats import (
    COUNTERS,
    GAUGES,
    SpecExtendStats,
    format_line,
)


@pytest.fixture
def metrics_env(tmp_path, monkeypatch):
    monkeypatch.setenv(METRICS_DIR_ENV, str(tmp_path))  # pytest makes it 0700
    return tmp_path


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    """Each test starts with no directory warned about in this process."""
    monkeypatch.setattr(snapshots, "_warned", set())


@pytest.fixture
def unset_env(tmp_path, monkeypatch):
    """No directory named; the temp directory is ``tmp_path``."""
    # Empty counts as unset; setenv makes monkeypatch restore the variable.
    monkeypatch.setenv(METRICS_DIR_ENV, "")
    monkeypatch.setenv(PROMETHEUS_DIR_ENV, "")
    monkeypatch.setattr(snapshots.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(snapshots, "_own_dirs", {})
    return tmp_path


def _assert_private(path):
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.geteuid()


def test_cpu_timers_accumulate(monkeypatch):
    clock = iter([10.0, 10.25, 20.0, 20.5])
    monkeypatch.setattr(stats_mod.time, "perf_counter", lambda: next(clock))
    stats = SpecExtendStats()
    cpu = torch.device("cpu")
    t = stats.start_timer(cpu)
    stats.stop_timer(t)
    assert stats.scoring_seconds == pytest.approx(0.25)
    t = stats.start_timer(cpu)
    stats.stop_timer(t)
    assert stats.scoring_seconds == pytest.approx(0.75)
    assert stats._pending == []
    stats.resolve_timers()
    assert stats.scoring_seconds == pytest.approx(0.75)


def test_cpu_timer_real_clock_nonnegative():
    stats = SpecExtendStats()
    for _ in range(3):
        stats.stop_timer(stats.start_timer(torch.device("cpu")))
    assert stats.scoring_seconds >= 0.0
    assert stats.snapshot()["scoring_seconds"] == stats.scoring_seconds


class FakeEvent:
    """A CUDA event's interface: ``done`` once the device has reached it."""

    def __init__(self, ms: float, done: bool) -> None:
        self.ms, self.done, self.waited = ms, done, False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = self.done = True

    def __reduce_ex__(self, protocol):
        # Neither can a torch.cuda.Event be copied or pickled: a snapshot that
        # deep-copied the pending timers raised inside an engine step (H100).
        raise TypeError("cannot pickle 'Event' object")

    def elapsed_time(self, end) -> float:
        assert self.done and end.done, "elapsed_time of an unfinished event"
        return end.ms - self.ms


def _timers(*specs):
    """[(start, end, counter)] with ``end`` finished or not."""
    return [(FakeEvent(0.0, True), FakeEvent(ms, done), counter)
            for ms, done, counter in specs]


def test_resolve_timers_takes_finished_events_only():
    stats = SpecExtendStats()
    stats._pending = _timers((250.0, True, "scoring_seconds"),
                             (500.0, False, "compaction_seconds"))
    unfinished = stats._pending[1]
    stats.resolve_timers()
    assert stats.scoring_seconds == pytest.approx(0.25)
    assert stats.compaction_seconds == 0.0
    assert stats._pending == [unfinished], "kept for a later report"
    assert not unfinished[1].waited, "never waits for the device"
    assert stats.snapshot(wait=False)["compaction_seconds"] == 0.0
    unfinished[1].done = True
    stats.resolve_timers()
    assert stats.compaction_seconds == pytest.approx(0.5)
    assert stats._pending == []


def test_snapshot_waits_for_timers_when_asked():
    """An RPC's or benchmark's snapshot (the default) counts every timer."""
    stats = SpecExtendStats()
    stats._pending = _timers((100.0, False, "scoring_seconds"))
    end = stats._pending[0][1]
    assert stats.snapshot()["scoring_seconds"] == pytest.approx(0.1)
    assert end.waited and stats._pending == []


def test_reporter_does_not_wait_for_device_timers(metrics_env):
    stats = SpecExtendStats()
    rep = StatsReporter(stats, 3600.0, log=lambda _: None)
    stats._pending = _timers((100.0, True, "scoring_seconds"),
                             (300.0, False, "scoring_seconds"))
    end = stats._pending[1][1]
    rep.maybe_report(force=True)
    assert not end.waited
    assert json.loads(rep.path.read_text())["scoring_seconds"] == pytest.approx(0.1)
    end.done = True
    rep.maybe_report(force=True)
    assert json.loads(rep.path.read_text())["scoring_seconds"] == pytest.approx(0.4)
    rep.close()


def test_snapshot_with_timers_pending():
    """The periodic snapshot leaves running timers alone, without copying them."""
    stats = SpecExtendStats(retrievals=2)
    stats._pending = _timers((100.0, False, "scoring_seconds"))
    snap = stats.snapshot(wait=False)
    assert snap["retrievals"] == 2 and snap["scoring_seconds"] == 0.0
    assert len(stats._pending) == 1


def test_a_failing_report_never_raises_into_the_step(metrics_env, monkeypatch):
    stats = SpecExtendStats()
    warned = []
    rep = StatsReporter(stats, 0.0, log=lambda _: None, warn=warned.append)

    def broken(wait=True):
        raise RuntimeError("boom")

    monkeypatch.setattr(stats, "snapshot", broken)
    monkeypatch.setattr(snapshots, "_warned", set())
    rep.maybe_report(force=True)
    rep.maybe_report(force=True)
    assert len(warned) == 1 and "boom" in warned[0] and "goes on" in warned[0]
    monkeypatch.undo()
    stats.retrievals = 5
    rep.maybe_report(force=True)  # recovers once the snapshot works again
    assert json.loads(rep.path.read_text())["retrievals"] == 5
    rep.close()


def test_snapshot_has_public_fields_only():
    stats = SpecExtendStats(retrievals=3, tracked_requests=2)
    snap = stats.snapshot()
    assert set(snap) == set(COUNTERS) | set(GAUGES)
    assert snap["retrievals"] == 3 and snap["tracked_requests"] == 2
    json.dumps(snap)  # serialisable


def _delta(**kw):
    base = dict.fromkeys(COUNTERS, 0)
    base.update(kw)
    return base


def test_format_line_content():
    delta = _delta(retrievals=5, view_rows=3, decode_rows=4,
                   draft_context_tokens=250, full_context_tokens=1000,
                   scoring_seconds=0.01, retrieval_steps=4)
    line = format_line(delta, {"tracked_requests": 7})
    assert line.startswith("SpecExtend metrics:")
    assert "retrievals: 5" in line
    assert "view rows: 3/4" in line
    assert "draft context: 25.0% of full" in line
    assert "scoring: 2.500 ms/step" in line
    assert "tracked requests: 7" in line
    assert "compaction" not in line


def test_format_line_compaction_cost():
    line = format_line(_delta(compactions=4, compaction_seconds=0.006),
                       {"tracked_requests": 1})
    assert "compaction: 1.500 ms/row" in line


def test_format_line_graph_share_only_where_graphs_ran():
    assert "draft graph: 30/40 steps" in format_line(
        _delta(graph_steps=30, graph_fallbacks=10), {"tracked_requests": 0})
    assert "draft graph" not in format_line(_delta(), {"tracked_requests": 0})


def test_format_line_zero_division_safe():
    line = format_line(_delta(), {"tracked_requests": 0})
    assert "draft context: 100.0% of full" in line
    assert "scoring: 0.000 ms/step" in line


def test_metrics_dir_from_env(metrics_env):
    assert snapshots.metrics_dir() == metrics_env
    assert snapshots.ensure_metrics_dir() == metrics_env


def test_private_dir_made_when_unset(unset_env):
    path = snapshots.ensure_metrics_dir()
    assert path.parent == unset_env and path.name.startswith(DIR_PREFIX)
    assert path.name != f"{DIR_PREFIX}{os.getpid()}", "not a predictable name"
    _assert_private(path)
    # Inherited by child processes through the environment, stable afterwards.
    assert os.environ[METRICS_DIR_ENV] == str(path)
    assert snapshots.ensure_metrics_dir() == path
    assert list(unset_env.iterdir()) == [path]
    snapshots.remove_own_dirs()
    assert not path.exists()


@pytest.mark.parametrize("planted", ["symlink", "directory"])
def test_predictable_old_path_is_not_used(unset_env, planted):
    """Another user's directory, or symlink, at the old predictable name
    ``<tmp>/specextend-metrics-<pid>`` gets nothing."""
    theirs = unset_env / "theirs"
    theirs.mkdir(mode=0o777)
    old = unset_env / f"{DIR_PREFIX}{os.getpid()}"
    if planted == "symlink":
        old.symlink_to(theirs)
    else:
        old.mkdir(mode=0o777)
    path = snapshots.ensure_metrics_dir()
    assert path != old
    stats = SpecExtendStats(retrievals=3)
    rep = StatsReporter(stats, 0.0, log=lambda _: None)
    rep.maybe_report(force=True)
    assert rep.path.parent == path
    assert json.loads(rep.path.read_text())["retrievals"] == 3
    assert SnapshotCollector(path).read()["retrievals"] == 3
    rep.close()
    snapshots.remove_own_dirs()
    assert list(theirs.iterdir()) == [] and old.exists(), "theirs, untouched"
    if planted == "directory":
        assert list(old.iterdir()) == []


def test_private_dir_inside_vllm_multiproc_dir(unset_env, monkeypatch):
    prom = unset_env / "prometheus"
    prom.mkdir()
    monkeypatch.setenv(PROMETHEUS_DIR_ENV, str(prom))
    path = snapshots.ensure_metrics_dir()
    assert path.parent == prom and path.name.startswith(DIR_PREFIX)
    _assert_private(path)


def test_private_dir_in_tmp_when_multiproc_dir_is_missing(unset_env, monkeypatch):
    monkeypatch.setenv(PROMETHEUS_DIR_ENV, str(unset_env / "missing"))
    path = snapshots.ensure_metrics_dir()
    assert path.parent == unset_env
    _assert_private(path)


def test_own_dir_kept_while_another_writer_lives(unset_env):
    """Removed after the processes that write into it have exited."""
    path = snapshots.ensure_metrics_dir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (path / f"worker-{dead.pid}.json").write_text("{}")
    live = path / f"worker-{os.getppid()}.json"  # a live process that is not us
    live.write_text("{}")
    snapshots.remove_own_dirs()
    assert live.exists()
    live.unlink()
    snapshots._own_dirs[path] = os.getpid()
    snapshots.remove_own_dirs()
    assert not path.exists(), "a dead writer's snapshot does not keep it"


def test_own_dir_removed_by_its_maker_only(unset_env):
    """A forked child exiting (it inherits the exit handlers) leaves its
    parent's directory alone; the parent removes it at its own exit."""
    script = (
        "import os, sys\n"
        "from vllm_specextend.serving import snapshots\n"
        "path = snapshots.ensure_metrics_dir()\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    sys.exit(0)\n"
        "os.waitpid(child, 0)\n"
        "print(path, path.is_dir(), flush=True)\n"
    )
    env = {**os.environ, METRICS_DIR_ENV: "", PROMETHEUS_DIR_ENV: "",
           "TMPDIR": str(unset_env)}
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path, exists_after_child = proc.stdout.split()
    assert exists_after_child == "True", "the child removed its parent's directory"
    assert path.startswith(str(unset_env / DIR_PREFIX))
    assert not os.path.exists(path), "the maker removes it when it exits"


def _unsafe_dir(kind: str, tmp_path, monkeypatch):
    """A named directory that must be refused, and where files would land."""
    path = tmp_path / "metrics"
    if kind == "symlink":
        target = tmp_path / "target"
        target.mkdir(mode=0o700)
        path.symlink_to(target)
        return path, target
    path.mkdir(mode=0o700)
    if kind == "mode":
        path.chmod(0o755)
    elif kind == "owner":
        if os.geteuid() == 0:
            os.chown(path, 65534, 65534)
        else:  # cannot give it away: be someone else instead
            uid = os.geteuid()
            monkeypatch.setattr(snapshots.os, "geteuid", lambda: uid + 1)
    return path, path


@pytest.mark.parametrize("kind, fix", [
    ("symlink", "is a symlink, which is not followed"),
    ("mode", "chmod 700"),
    ("owner", "not by this user"),
])
def test_named_dir_refused_once_engine_goes_on(kind, fix, tmp_path, monkeypatch):
    """A SPECEXTEND_METRICS_DIR that is a symlink, not ours or not 0700: one
    warning naming the fix, nothing published, counting and logging go on."""
    path, lands = _unsafe_dir(kind, tmp_path, monkeypatch)
    monkeypatch.setenv(METRICS_DIR_ENV, str(path))
    warned, lines = [], []
    assert snapshots.ensure_metrics_dir(warned.append) == path
    assert len(warned) == 1 and str(path) in warned[0] and fix in warned[0], warned
    stats = SpecExtendStats()
    rep = StatsReporter(stats, 0.0, lines.append, warn=warned.append)
    for _ in range(3):
        stats.retrievals += 1
        stats.decode_rows += 1
        rep.maybe_report(force=True)
    assert len(warned) == 1, "once, not per report"
    assert len(lines) == 3 and stats.retrievals == 3
    collector = SnapshotCollector(path, warn=warned.append)
    assert list(collector.collect()) == [], "refused: series left out"
    assert list(lands.iterdir()) == []
    rep.close()


def test_reporter_writes_snapshot_and_logs(metrics_env):
    stats = SpecExtendStats()
    lines = []
    rep = StatsReporter(stats, interval_s=3600.0, log=lines.append)
    assert rep.path.parent == metrics_env
    assert rep.path.name.startswith("worker-") and rep.path.suffix == ".json"

    stats.retrievals += 2
    stats.decode_rows += 3
    rep.maybe_report()  # interval not reached: nothing happens
    assert not rep.path.exists()
    assert lines == []

    rep.maybe_report(force=True)
    data = json.loads(rep.path.read_text())
    assert data["retrievals"] == 2 and data["decode_rows"] == 3
    assert len(lines) == 1 and "retrievals: 2" in lines[0]
    assert not rep.path.with_suffix(".tmp").exists()

    # Deltas: no new work -> file refreshed, no log line.
    stats.tracked_requests = 4
    rep.maybe_report(force=True)
    assert len(lines) == 1
    assert json.loads(rep.path.read_text())["tracked_requests"] == 4

    stats.retrievals += 1
    rep.maybe_report(force=True)
    assert len(lines) == 2 and "retrievals: 1," in lines[1]

    rep.close()
    assert not rep.path.exists()
    rep.close()  # idempotent


def test_forced_reports_leave_the_interval_alone(metrics_env, monkeypatch):
    """Batches that empty more often than the interval (each forces a report
    with nothing tracked) must not hold back the periodic report that shows
    the requests running: /metrics would never see one."""
    now = [100.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: now[0])
    stats = SpecExtendStats()
    rep = StatsReporter(stats, interval_s=10.0, log=lambda s: None)

    def published() -> int:
        return json.loads(rep.path.read_text())["tracked_requests"]

    for t in (104.0, 108.0):  # a request runs, then the batch empties
        now[0] = t
        stats.tracked_requests = 0
        rep.maybe_report(force=True)
        assert published() == 0
    now[0], stats.tracked_requests = 110.0, 2
    rep.maybe_report()  # 10 s after the last periodic report: due
    assert published() == 2
    now[0], stats.tracked_requests = 115.0, 3
    rep.maybe_report()  # 5 s after it: not yet
    assert published() == 2
    rep.close()


def test_reporter_interval_zero_reports_every_call(metrics_env):
    stats = SpecExtendStats()
    rep = StatsReporter(stats, interval_s=0.0, log=lambda s: None)
    stats.view_rows = 9
    rep.maybe_report()
    assert json.loads(rep.path.read_text())["view_rows"] == 9
    rep.close()


def test_unpublished_reporter_keeps_interval_writes_nothing(metrics_env):
    stats = SpecExtendStats(retrievals=3)
    lines = []
    rep = StatsReporter(stats, interval_s=0.0, log=lines.append, publish=False)
    assert rep.due()
    rep.maybe_report(force=True)
    assert lines == [] and list(metrics_env.glob("*")) == []
    rep.interval_s = 3600.0
    assert not rep.due(), "the interval restarts even when nothing is published"
    rep.close()


def test_reporter_remakes_a_removed_directory(metrics_env):
    """The H100 crash: maybe_report raised FileNotFoundError on
    ``worker-<pid>.tmp`` once the directory was removed under the worker."""
    warned = []
    stats = SpecExtendStats(retrievals=1)
    rep = StatsReporter(stats, 3600.0, log=lambda _: None, warn=warned.append)
    rep.maybe_report(force=True)
    shutil.rmtree(metrics_env)
    stats.retrievals = 2
    rep.maybe_report(force=True)
    _assert_private(metrics_env)
    assert json.loads(rep.path.read_text())["retrievals"] == 2
    assert len(warned) == 1 and "was missing" in warned[0], warned
    # Another trouble gets its own warning, once.
    shutil.rmtree(metrics_env)
    metrics_env.write_text("")
    for _ in range(2):
        rep.maybe_report(force=True)
    assert len(warned) == 2 and "is not a directory" in warned[1], warned
    metrics_env.unlink()
    rep.close()


@pytest.mark.parametrize("broken", ["parent removed", "file in its place"])
def test_reporter_fails_soft_and_resumes(tmp_path, monkeypatch, broken):
    """A directory that cannot be made again, or is not one: each report goes
    on (one warning), counters keep counting; publishing resumes once the
    directory is usable again."""
    parent = tmp_path / "parent"
    directory = parent / "metrics"
    directory.mkdir(parents=True, mode=0o700)
    monkeypatch.setenv(METRICS_DIR_ENV, str(directory))
    warned, lines = [], []
    stats = SpecExtendStats()
    rep = StatsReporter(stats, 0.0, lines.append, warn=warned.append)
    if broken == "parent removed":
        shutil.rmtree(parent)
    else:
        directory.rmdir()
        directory.write_text("")
    for _ in range(3):
        stats.decode_rows += 1
        rep.maybe_report(force=True)
    assert len(warned) == 1 and str(directory) in warned[0], warned
    assert len(lines) == 3 and stats.decode_rows == 3
    assert SnapshotCollector(directory).read()["decode_rows"] == 0
    if broken == "parent removed":
        parent.mkdir()
    else:
        directory.unlink()
    rep.maybe_report(force=True)
    assert json.loads(rep.path.read_text())["decode_rows"] == 3
    _assert_private(directory)
    rep.close()
    assert not rep.path.exists()


def _families(collector):
    return {fam.name: fam for fam in collector.collect()}


def test_collector_sums_workers(metrics_env):
    a = SpecExtendStats(retrievals=2, view_rows=5, decode_rows=8,
                        draft_context_tokens=100, full_context_tokens=400,
                        scoring_seconds=0.5, retrieval_steps=1, tracked_requests=3)
    b = SpecExtendStats(retrievals=1, view_rows=1, decode_rows=2,
                        draft_context_tokens=10, full_context_tokens=40,
                        scoring_seconds=0.25, retrieval_steps=2, tracked_requests=1)
    (metrics_env / "worker-1.json").write_text(json.dumps(a.snapshot()))
    (metrics_env / "worker-2.json").write_text(json.dumps(b.snapshot()))
    (metrics_env / "worker-3.json").write_text("{not json")  # half-written
    (metrics_env / "other.json").write_text(json.dumps({"retrievals": 100}))

    collector = SnapshotCollector(metrics_env)
    total = collector.read()
    assert total["retrievals"] == 3
    assert total["tracked_requests"] == 4
    assert total["scoring_seconds"] == pytest.approx(0.75)

    fams = _families(collector)
    assert set(fams) == {f"vllm:spec_extend_{k}" for k in [*COUNTERS, *GAUGES]}
    want = {
        "retrievals": 3, "retrieval_steps": 3, "view_rows": 6, "decode_rows": 10,
        "draft_context_tokens": 110, "full_context_tokens": 440,
        "scoring_seconds": 0.75, "tracked_requests": 4,
    }
    for key, value in want.items():
        fam = fams[f"vllm:spec_extend_{key}"]
        assert len(fam.samples) == 1
        assert fam.samples[0].value == pytest.approx(value), key
    assert fams["vllm:spec_extend_retrievals"].type == "counter"
    assert fams["vllm:spec_extend_tracked_requests"].type == "gauge"


def test_collector_with_reporters_end_to_end(metrics_env, monkeypatch):
    s1, s2 = SpecExtendStats(), SpecExtendStats()
    monkeypatch.setattr(snapshots, "_alive", lambda pid: pid in (111, 222))
    monkeypatch.setattr(metrics.os, "getpid", lambda: 111)
    r1 = StatsReporter(s1, 0.0, lambda s: None)
    monkeypatch.setattr(metrics.os, "getpid", lambda: 222)
    r2 = StatsReporter(s2, 0.0, lambda s: None)
    assert r1.path != r2.path
    s1.retrievals, s2.retrievals = 4, 6
    r1.maybe_report(force=True)
    r2.maybe_report(force=True)
    collector = SnapshotCollector(metrics_env)
    fams = _families(collector)
    assert fams["vllm:spec_extend_retrievals"].samples[0].value == 10
    r1.close()
    assert _families(collector)["vllm:spec_extend_retrievals"].samples[0].value == 6
    r2.close()
    assert collector.read() == dict.fromkeys([*COUNTERS, *GAUGES], 0)


def test_collector_skips_dead_workers(tmp_path):
    (tmp_path / f"worker-{os.getpid()}.json").write_text(json.dumps({"retrievals": 2}))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"worker-{dead.pid}.json").write_text(json.dumps({"retrievals": 5}))
    assert SnapshotCollector(tmp_path).read()["retrievals"] == 2


def test_collector_empty_dir(tmp_path):
    collector = SnapshotCollector(tmp_path)
    fams = _families(collector)
    assert all(f.samples[0].value == 0 for f in fams.values())


def _proposer_with_batch(live, interval_s):
    import torch

    from vllm_specextend.drafting.deferral import PrefillDeferral
    from vllm_specextend.proposer import SpecExtendProposer
    from vllm_specextend.retrieval.state import SelectionState

    proposer = object.__new__(SpecExtendProposer)  # no engine: only the bookkeeping
    proposer.deferral = PrefillDeferral()
    proposer.state = SelectionState(4, 2, torch.device("cpu"))
    proposer.stats = SpecExtendStats()
    proposer.runner = types.SimpleNamespace(requests=dict.fromkeys(live))
    proposer.reporter = StatsReporter(proposer.stats, interval_s, log=lambda _: None)
    return proposer


def test_last_requests_ending_publish_at_once(metrics_env):
    """The step that ends the last requests publishes before the interval: no
    draft step follows to report their counts."""
    proposer = _proposer_with_batch(["a", "b", "c"], interval_s=3600.0)
    proposer.stats.decode_rows = 5
    proposer.on_requests_done({"a"})  # "b" and "c" still run: wait for the interval
    assert not proposer.reporter.path.exists()
    del proposer.runner.requests["a"]  # the runner drops it in its own step
    proposer.on_requests_done({"b", "c"})
    assert json.loads(proposer.reporter.path.read_text())["decode_rows"] == 5


def test_slots_held_are_published_apart_from_selections(metrics_env):
    """A request with a slot but no selection yet (its prefill) shows in
    ``request_slots`` only; giving the slots back zeroes both gauges."""
    proposer = _proposer_with_batch(["a", "b"], interval_s=3600.0)
    proposer.state.slots_for(["a", "b"])
    proposer._report(force=True)
    published = json.loads(proposer.reporter.path.read_text())
    assert (published["request_slots"], published["tracked_requests"]) == (2, 0)
    proposer.runner.requests.clear()
    proposer.on_requests_done({"a", "b"})
    published = json.loads(proposer.reporter.path.read_text())
    assert (published["request_slots"], published["tracked_requests"]) == (0, 0)


def test_requests_done_survives_a_removed_directory(tmp_path, monkeypatch):
    """The crash's own path: on_requests_done publishing into a directory
    whose parent is gone returns, and the request's state is still freed."""
    directory = tmp_path / "parent" / "metrics"
    directory.mkdir(parents=True, mode=0o700)
    monkeypatch.setenv(METRICS_DIR_ENV, str(directory))
    proposer = _proposer_with_batch(["a"], interval_s=3600.0)
    proposer.state.slots_for(["a"])  # "a" holds a state slot
    assert "a" in proposer.state
    shutil.rmtree(tmp_path / "parent")
    proposer.on_requests_done({"a"})
    assert "a" not in proposer.state and not directory.exists()


def test_series_carry_vllm_labels_per_engine(metrics_env, monkeypatch):
    """Labelled as ``vllm:spec_decode_*`` (model_name, engine); one series per
    engine, 0 for an engine whose workers have not published yet."""
    monkeypatch.setattr(snapshots, "_alive", lambda pid: True)
    for pid, engine, retrievals in ((11, 0, 2), (12, 0, 3), (13, 1, 7)):
        monkeypatch.setattr(metrics.os, "getpid", lambda pid=pid: pid)
        stats = SpecExtendStats(retrievals=retrievals)
        reporter = StatsReporter(stats, 0.0, lambda s: None, engine=engine)
        reporter.maybe_report(force=True)
    collector = SnapshotCollector(metrics_env, model_name="tiny", engines=(0, 1, 2))
    samples = {
        (s.labels["model_name"], s.labels["engine"]): s.value
        for s in _families(collector)["vllm:spec_extend_retrievals"].samples
    }
    assert samples == {("tiny", "0"): 5, ("tiny", "1"): 7, ("tiny", "2"): 0}
    assert collector.read()["retrievals"] == 12


def test_collector_text_format(metrics_env):
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(SnapshotCollector(metrics_env, model_name="m"))
    text = generate_latest(registry).decode()
    assert 'vllm:spec_extend_view_rows_total{engine="0",model_name="m"} 0.0' in text
    assert 'vllm:spec_extend_tracked_requests{engine="0",model_name="m"} 0.0' in text


def test_install_collector_once_and_uninstall(metrics_env):
    from prometheus_client import REGISTRY

    # An in-process engine test of this session may have installed one (the
    # first engine config names the labels): start from none. (test_compat's
    # teardown removed it while that module ran before this one; its tests
    # now run last, with the background lane's.)
    metrics.uninstall_collector()
    metrics.install_collector("a")
    try:
        metrics.install_collector("b")  # the first engine config names the labels
        assert REGISTRY.get_sample_value(
            "vllm:spec_extend_retrievals_total", {"model_name": "a", "engine": "0"}
        ) == 0
    finally:
        metrics.uninstall_collector()
    assert REGISTRY.get_sample_value(
        "vllm:spec_extend_retrievals_total", {"model_name": "a", "engine": "0"}
    ) is None
