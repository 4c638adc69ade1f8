"""``vllm bench serve`` runs through one warm process.

A ``vllm bench serve`` command imports vLLM's whole CLI (every subcommand's
modules, the OpenAI server's among them) before it sends a request: 23 s of
a core on the 2-core CI machine, where a CPU test's run then takes a few
seconds; bench_serve's CI job ran 18 of them. ``BenchClient`` starts one
process that imports only what that command runs, ``vllm.benchmarks.serve``
(its arguments and its ``main``), and hands it each run's arguments, the ones
the command gets; each run's output goes to the run's log, as the command's
would. The figures are vLLM bench's, from the same code and arguments: the
runs share the import, and ``main`` sets up the rest per run (its seeds, its
event loop, its HTTP session, its dataset). A run past its timeout ends the
process, and the next run starts another. Results keep recording the
``vllm bench serve`` command a user would type for the run
(``bench_serve.bench_command``).

    python -m benchmarks.serve.bench_client   # stdin: {"argv": [...], "log": PATH}
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import traceback
from pathlib import Path

CHILD = [sys.executable, "-m", "benchmarks.serve.bench_client"]


class BenchClient:
    """The parent's side: one warm client process, a run at a time. Its own
    output (vLLM's import-time log lines) goes to ``log``."""

    def __init__(self, log: Path, command: list[str] | None = None) -> None:
        self.log = log
        self.command = command or CHILD
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        with self.log.open("ab") as err:
            return subprocess.Popen(self.command, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err)

    def run(self, argv: list[str], log: Path, timeout: float) -> int | str:
        """Runs ``vllm bench serve ARGV`` (the arguments after ``serve``) with
        its output in ``log``: its exit status, or "timeout"."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        job = json.dumps({"argv": argv, "log": str(log)}) + "\n"
        try:
            self.proc.stdin.write(job.encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            return f"client exited ({self.proc.wait()}) before the run"
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self._stop()
            return "timeout"
        line = self.proc.stdout.readline()
        if not line:
            return f"client exited ({self.proc.wait()}) during the run"
        return json.loads(line)["rc"]

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self._stop()

    def __enter__(self) -> BenchClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_one(parser, main, argv: list[str], log: str) -> int:
    """One run with fds 1 and 2 in ``log`` (vLLM bench prints, and so do the
    libraries under it): its exit status, as the command's would be."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "a", buffering=1) as out, contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(out):
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            main(parser.parse_args(argv))
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:  # the command would print it and exit 1
            traceback.print_exc()
            rc = 1
        finally:
            out.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return rc


def serve_runs() -> None:
    # Replies go to the parent on the original stdout; anything else printed
    # from here on goes where stderr goes (the client's log).
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from vllm import platforms
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # As ``vllm bench`` does: a benchmark client needs no accelerator.
    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()
    for line in sys.stdin:
        job = json.loads(line)
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        reply.write(json.dumps({"rc": run_one(parser, main, job["argv"], job["log"])})
                    + "\n")


if __name__ == "__main__":
    serve_runs()
