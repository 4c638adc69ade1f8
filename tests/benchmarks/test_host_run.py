"""benchmarks/gpu/host_run.sh's side_by_side: one evaluation process per
dataset, all at once, and the call fails when any of them does."""

from __future__ import annotations

import re
import subprocess
import textwrap

from benchmarks.harness.meta import REPO_ROOT

# A python3 that stands in for `python3 -m benchmarks.eval_longinput run ...`:
# it announces itself, waits until every dataset's process has started (so
# processes run one after another would time out), writes its --out files.
FAKE_PYTHON = textwrap.dedent("""\
    #!/bin/bash
    while [ $# -gt 0 ]; do
      case $1 in --datasets) ds=$2; shift ;; --out) out=$2; shift ;; esac; shift
    done
    touch "$MARKS/$ds"
    for _ in $(seq 100); do
      [ "$(ls "$MARKS" | wc -l)" -ge "$EXPECT" ] && break; sleep 0.1
    done
    [ "$(ls "$MARKS" | wc -l)" -ge "$EXPECT" ] || { echo "ran alone" >&2; exit 9; }
    echo "{}" > "$out"; echo "table of $ds" > "${out%.json}.md"
    rc_var=RC_$ds; exit ${!rc_var:-0}
    """)


def side_by_side_source() -> str:
    text = (REPO_ROOT / "benchmarks/gpu/host_run.sh").read_text()
    return re.search(r"^side_by_side\(\) \{\n.*?^\}\n", text, re.S | re.M).group(0)


def run(tmp_path, env_extra: dict) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    script = (side_by_side_source()
              + 'side_by_side grid23_4096 "govreport pg19" --target T --lengths 4096\n'
              + 'echo "rc=$?"\n')
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(out), "MARKS": str(marks),
           "EXPECT": "2", **env_extra}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)


def test_datasets_run_at_once_each_to_its_own_files(tmp_path):
    done = run(tmp_path, {})
    assert done.stdout.strip().endswith("rc=0"), done.stdout + done.stderr
    assert "table of govreport" in done.stdout and "table of pg19" in done.stdout
    for ds in ("govreport", "pg19"):
        assert (tmp_path / "out" / f"grid23_4096_{ds}.json").exists()
        assert (tmp_path / "out" / f"grid23_4096_{ds}.log").exists()


def test_a_failing_dataset_fails_the_call(tmp_path):
    done = run(tmp_path, {"RC_pg19": "3"})
    assert done.stdout.strip().endswith("rc=3"), done.stdout + done.stderr
    assert "table of govreport" in done.stdout
