"""``vllm ARGV`` runs that share one import of vLLM's CLI.

A ``vllm`` command imports vLLM's whole CLI (every subcommand's modules)
before it parses a flag: 15 s of a core, about 25 s on the loaded 2-core CI
machine, for a run that then stops at parse or config time within a second
(the command-line tests' nine runs took 170 s of CI at 3a84dde). Here one
warm process (this file, run as a script) imports what the ``vllm`` script's
``main`` imports, then forks a child for each run. The child takes the run's
environment, arguments and output files and calls that same ``main``; an
uncaught exception goes to ``sys.excepthook`` (the plugin's one-line errors
are printed there) and exits 1, ``SystemExit`` exits with its code, and the
exit handlers run, as when Python itself ends. The child leads a session of
its own, so a run past its timeout is ended with what it started. Only the
environment read when vLLM's CLI is imported (the warm process's) is shared:
a run's own variables are read later (the metrics directory, the API key).

    cli = WarmCli(env)            # the warm process starts on the first run
    proc = cli.run(["serve", "--help"], env, timeout=180)   # CompletedProcess
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path


class WarmCli:
    """The tests' side: one warm process, one run at a time (a lock keeps
    the lane's thread and a test's apart)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def run(self, argv: list[str], env: dict[str, str], timeout: float
            ) -> subprocess.CompletedProcess:
        """``vllm ARGV`` in ``env`` to its end: its exit status and output,
        as ``subprocess.run(..., capture_output=True, text=True)`` gives them;
        past ``timeout``, ``subprocess.TimeoutExpired`` after its session is
        ended."""
        with self.lock, tempfile.TemporaryDirectory(prefix="warm-cli-") as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            if self.proc is None or self.proc.poll() is not None:
                self.proc = subprocess.Popen(
                    [sys.executable, __file__], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, env=self.env, start_new_session=True)
            job = {"argv": argv, "env": env, "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
            pid = json.loads(self.proc.stdout.readline())["pid"]
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not ready:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self.proc.stdout.readline()  # the warm process reaps it
                raise subprocess.TimeoutExpired(["vllm", *argv], timeout,
                                                out.read_text(), err.read_text())
            status = json.loads(self.proc.stdout.readline())["status"]
            return subprocess.CompletedProcess(["vllm", *argv], status,
                                               out.read_text(), err.read_text())

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()  # the warm process ends at end of input
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _child(job: dict) -> int:
    """One run, in the forked child: the ``vllm`` script's ``main``."""
    from vllm.entrypoints.cli.main import main

    os.environ.clear()
    os.environ.update(job["env"])
    for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = ["vllm", *job["argv"]]
    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            sys.stderr.write(f"{e.code}\n")
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    import atexit

    atexit._run_exitfuncs()  # what the interpreter runs as it ends
    return code


def _serve() -> None:
    """The warm process: vLLM's CLI imported once, a forked child per job
    read from stdin; writes the child's pid, then its exit status, to the
    stdout it was started with (vLLM logs to stdout: that goes to stderr)."""
    global _REPLIES
    _REPLIES = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import vllm.entrypoints.cli.benchmark.main  # noqa: F401
    import vllm.entrypoints.cli.collect_env  # noqa: F401
    import vllm.entrypoints.cli.launch  # noqa: F401
    import vllm.entrypoints.cli.main  # noqa: F401
    import vllm.entrypoints.cli.openai  # noqa: F401
    import vllm.entrypoints.cli.run_batch  # noqa: F401
    import vllm.entrypoints.cli.serve  # noqa: F401

    for line in sys.stdin:
        job = json.loads(line)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            os.setsid()
            code = 1
            try:
                code = _child(job)
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        _reply({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _reply({"status": os.waitstatus_to_exitcode(status)})


_REPLIES = sys.stdout


def _reply(message: dict) -> None:
    _REPLIES.write(json.dumps(message) + "\n")
    _REPLIES.flush()


if __name__ == "__main__":
    _serve()
