"""``benchmarks/gpu/detached.sh``: a run that outlives the device call that
started it, picked up by the next call."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "detached.sh"


def _bash(root: Path, body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source {SCRIPT}; {body}"], text=True,
                          capture_output=True, timeout=timeout,
                          env={"DETACHED_ROOT": str(root), "PATH": "/usr/bin:/bin"})


def test_a_run_outlives_its_call_and_the_next_call_collects_it(tmp_path):
    run = tmp_path / "job"
    flag = tmp_path / "go"
    # The command waits for a flag, with an argument that needs quoting.
    # (bounded: a failing test leaves no process behind for long).
    cmd = (f"detached {run} 1 timeout 60 bash -c "
           f"'while [ ! -f {flag} ]; do sleep 0.2; done; echo \"a b\"; exit 7'")
    first = _bash(tmp_path, f"{cmd}; echo status=$?; detached_running")
    assert "job: started" in first.stdout and "still running" in first.stdout
    assert "status=1" in first.stdout and first.stdout.strip().endswith("job")
    # A second call starts nothing new: the command ran once.
    flag.touch()
    second = _bash(tmp_path, f"{cmd}; echo status=$?; detached_running || echo none")
    assert "started" not in second.stdout
    assert "job rc=7" in second.stdout and "status=0" in second.stdout
    assert second.stdout.strip().endswith("none")
    assert (run / "runner.log").read_text() == "a b\n"
