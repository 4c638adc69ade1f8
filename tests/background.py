"""Jobs that run beside the tests: subprocesses started early, read late.

Much of the CPU suite's time goes to processes that start vLLM (a benchmark
script with its engines or servers, a ``vllm serve`` that must fail), each of
which imports vLLM for 10-20 s on one core while the test process only waits:
on the 2-core CI machine the other core idles. A test module hands such work
to one background lane by naming it in ``BACKGROUND``, a dict of job name to
*starter*:

* ``starter(fixture)`` runs in pytest's main thread when the session starts
  (``fixture``: ``request.getfixturevalue``, for the session's fixtures: the
  tiny models, ``long_prompts``, ``tmp_path_factory``) and returns ``job``;
* ``job()`` runs in the lane's one thread, jobs one after another. It runs
  subprocesses (``run``) and reads files only: no pytest calls, no in-process
  engine, no signal handlers.

The modules with jobs run last (``order``), in the order of their jobs, so
that the rest of the suite runs meanwhile (a module the session runs only in
part, ``-k``, starts a job when its test asks for it); their tests read a job's return
value with ``result(request, name)``, which raises what the job raised. A
starter that skips (no data) or fails at the session's start is called again
by ``result``, in the test, which then reports it. ``summary`` lists each job's
seconds (pytest's durations show only what a test still waited for).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

_lane: ThreadPoolExecutor | None = None
_jobs: dict[tuple[str, str], Future] = {}
_seconds: dict[tuple[str, str], float] = {}
_running: set[subprocess.Popen] = set()
_collected: dict = {}  # module: its tests collected
_lock = threading.Lock()


def _modules(items) -> list:
    """The modules of ``items`` that have jobs, in the items' order."""
    return [m for m in dict.fromkeys(getattr(item, "module", None) for item in items)
            if getattr(m, "BACKGROUND", None)]


def order(items) -> list:
    """``items`` (all that were collected) with the tests of modules that
    have jobs moved to the end, each module's tests still together and in
    their order."""
    for module in _modules(items):
        _collected[module] = sum(getattr(i, "module", None) is module for i in items)
    last = set(_collected)
    return sorted(items, key=lambda item: getattr(item, "module", None) in last)


def _submit(key: tuple[str, str], job) -> Future:
    global _lane
    if _lane is None:
        _lane = ThreadPoolExecutor(max_workers=1, thread_name_prefix="background")

    def timed():
        start = time.monotonic()
        try:
            return job()
        finally:
            _seconds[key] = time.monotonic() - start

    _jobs[key] = _lane.submit(timed)
    return _jobs[key]


def start(request) -> None:
    """Queue the jobs of every module the session runs whole; a module run in
    part (``-k``) starts a job when a test asks for it."""
    items = request.session.items
    for module in _modules(items):
        selected = sum(getattr(i, "module", None) is module for i in items)
        if selected != _collected.get(module):
            continue
        for name, starter in module.BACKGROUND.items():
            try:
                job = starter(request.getfixturevalue)
            except (Exception, pytest.skip.Exception, pytest.fail.Exception):
                continue  # result() calls it again, in the test that reports it
            _submit((module.__name__, name), job)


def result(request, name: str):
    """What the module's job ``name`` returned, once it has run."""
    key = (request.module.__name__, name)
    future = _jobs.get(key)
    if future is None:
        future = _submit(key, request.module.BACKGROUND[name](request.getfixturevalue))
    return future.result()


def run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=...)``
    in a session of its own, which ``stop`` ends if pytest ends first."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True, **kwargs) as proc:
        with _lock:
            _running.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            _end(proc)
            e.stdout, e.stderr = proc.communicate()
            raise
        finally:
            with _lock:
                _running.discard(proc)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _end(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the process's group (a benchmark stops its servers on it),
    then SIGKILL to what is left of it after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)


def stop() -> None:
    """At the session's end: drop the jobs not started, end the running one."""
    global _lane
    if _lane is None:
        return
    for future in _jobs.values():
        future.cancel()
    with _lock:
        running = list(_running)
    for proc in running:
        _end(proc)
    _lane.shutdown(wait=True)
    _lane = None


def summary() -> list[str]:
    """One line per job that ran: its seconds, its module and name."""
    return [f"{s:8.2f}s {module}::{name}"
            for (module, name), s in sorted(_seconds.items(), key=lambda kv: -kv[1])]
