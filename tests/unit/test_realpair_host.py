"""benchmarks/realpair/host.sh early: the target's join and conversion start,
detached, in the call that stages its last piece, from copies of the code and
the gguf package (the device tool re-copies the working tree at every call),
once vLLM's install is done; without the gguf package or the manifest it stops
with the fix. build's wait for it (wait_early): none where no job started or
its job died, its status where it finished. CPU: a stand-in python3 that
records how it was called."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
import textwrap
import time

from benchmarks.harness.meta import REPO_ROOT

HOST = REPO_ROOT / "benchmarks/realpair/host.sh"

FAKE_PYTHON = textwrap.dedent("""\
    #!/bin/bash
    { echo "cwd=$PWD"; echo "PYTHONPATH=$PYTHONPATH"; echo "ARGS=$*"; } >> "$CALLS"
    """)


def _host(tmp_path, kit: bool = True):
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / "benchmarks/models").mkdir(parents=True)
    (repo / "benchmarks/models/qwen_pair.py").write_text("# the joiner\n")
    (repo / ".gpu/pair").mkdir(parents=True)
    if kit:
        (repo / ".gpu/pair/kit").mkdir()
        (tmp_path / "gguf").mkdir()
        (tmp_path / "gguf/__init__.py").write_text("")
        with tarfile.open(repo / ".gpu/pair/kit/gguf_pkg.tgz", "w:gz") as tar:
            tar.add(tmp_path / "gguf", arcname="gguf")
        (repo / ".gpu/pair/manifest.json").write_text("{}")
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    (tmp_path / "vsite").mkdir()
    (tmp_path / "vsite/.done").touch()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PAIR_DIR": str(tmp_path / "pair"),
           "PAIRTOOL_DIR": str(tmp_path / "tool"), "VSITE_DIR": str(tmp_path / "vsite"),
           "CALLS": str(tmp_path / "calls.txt")}
    done = subprocess.run(["bash", str(HOST), "early"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60)
    return done, tmp_path / "pair"


def _rc(pair) -> None:
    """Until the detached job wrote its status (at most 30 s)."""
    for _ in range(300):
        if (pair / "early.rc").is_file():
            return
        time.sleep(0.1)


def test_early_joins_and_converts_the_target_from_copies(tmp_path):
    done, pair = _host(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("target: joining and converting, detached")
    _rc(pair)
    assert (pair / "early.rc").read_text().strip() == "0"
    tool, vsite = tmp_path / "tool", tmp_path / "vsite"
    assert (tmp_path / "calls.txt").read_text().splitlines() == [
        f"cwd={tool}", f"PYTHONPATH={tool}:{vsite}",
        f"ARGS=-m benchmarks.models.qwen_pair join {pair}/stage {pair} --role target"]
    assert (tool / "benchmarks/models/qwen_pair.py").is_file()
    assert (vsite / "gguf/__init__.py").is_file()  # the package, before the join
    assert (pair / "stage/manifest.json").read_text() == "{}"


def test_early_without_the_kit_stops_with_the_fix(tmp_path):
    done, pair = _host(tmp_path, kit=False)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "early: no .gpu/pair/kit/gguf_pkg.tgz: carry .gpu/pair/kit/gguf_pkg.tgz "
        "and .gpu/pair/manifest.json in this call")
    assert not (pair / "early.pid").exists() and not (tmp_path / "tool").exists()
    assert not os.path.exists(tmp_path / "calls.txt")
    assert _wait_early(pair).stdout == "rc=0\n"  # build goes on at once


def _wait_early(pair) -> subprocess.CompletedProcess:
    found = re.findall(r"^wait_early\(\) \{\n.*?^\}\n", HOST.read_text(), re.S | re.M)
    assert len(found) == 1
    return subprocess.run(["bash", "-c", f"P={pair}\n{found[0]}wait_early\necho rc=$?"],
                          capture_output=True, text=True, timeout=30)


def test_build_waits_for_early_and_goes_on_where_its_job_died(tmp_path):
    done, pair = _host(tmp_path)
    assert done.returncode == 0, done.stderr
    _rc(pair)
    waited = _wait_early(pair)
    assert waited.stdout.startswith("target converted early: rc=0\n")
    assert waited.stdout.endswith("rc=0\n")
    (pair / "early.rc").unlink()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (pair / "early.pid").write_text(f"{dead.pid}\n")
    waited = _wait_early(pair)
    assert waited.stdout.startswith("target converted early: rc=none\n"), waited
