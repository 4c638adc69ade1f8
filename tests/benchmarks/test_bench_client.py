"""benchmarks.serve.bench_client: a run's output and exit status as the
``vllm bench serve`` command's would be, one process for many runs, and a
fresh one after a run that hung. (Runs against a real server:
test_bench_serve.py.)"""

from __future__ import annotations

import argparse
import sys

from benchmarks.serve.bench_client import BenchClient, run_one


def parser():
    p = argparse.ArgumentParser(prog="vllm bench serve")
    p.add_argument("--what", required=True)
    return p


def fake_main(args):
    print(f"ran {args.what}")  # noqa: T201
    if args.what == "exit3":
        sys.exit(3)
    if args.what == "raise":
        raise ValueError("no server")


def test_run_one_logs_output_and_returns_the_commands_status(tmp_path):
    log = tmp_path / "run.log"
    stdout, stderr = sys.stdout, sys.stderr
    assert run_one(parser(), fake_main, ["--what", "ok"], str(log)) == 0
    assert run_one(parser(), fake_main, ["--what", "exit3"], str(log)) == 3
    assert run_one(parser(), fake_main, ["--what", "raise"], str(log)) == 1
    assert run_one(parser(), fake_main, ["--bad"], str(log)) == 2  # argparse
    text = log.read_text()
    assert "ran ok" in text and "ran exit3" in text
    assert "ValueError: no server" in text and "--what" in text
    assert (sys.stdout, sys.stderr) == (stdout, stderr)  # given back


FAKE_CHILD = """
import json, os, sys, time
for line in sys.stdin:
    job = json.loads(line)
    if job["argv"] == ["hang"]:
        time.sleep(60)
    if job["argv"] == ["die"]:
        sys.exit(9)
    print(json.dumps({"rc": os.getpid()}), flush=True)
"""


def test_one_process_for_many_runs_and_a_new_one_after_a_hang(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(FAKE_CHILD)
    log = tmp_path / "run.log"
    with BenchClient(tmp_path / "client.log", [sys.executable, str(child)]) as client:
        first = client.run(["a"], log, timeout=30)
        assert client.run(["b"], log, timeout=30) == first  # the same process
        assert client.run(["hang"], log, timeout=0.5) == "timeout"
        second = client.run(["c"], log, timeout=30)
        assert isinstance(second, int) and second != first
        died = client.run(["die"], log, timeout=30)
        assert died == "client exited (9) during the run"
        assert client.run(["d"], log, timeout=30) not in (first, second)
        proc = client.proc
    assert proc.poll() is not None  # closed with the block
