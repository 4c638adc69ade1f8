"""benchmarks/realpair/host.sh early: the target's join and conversion start,
detached, in the call that stages its last piece, from copies of the code and
the gguf package (the device tool re-copies the working tree at every call),
once vLLM's install is done; without the kit or the manifest it stops with the
fix. CPU: a stand-in python3 that records how it was called."""

from __future__ import annotations

import os
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


def test_early_joins_and_converts_the_target_from_copies(tmp_path):
    done, pair = _host(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("target: joining and converting, detached")
    for _ in range(300):
        if (pair / "early.rc").is_file():
            break
        time.sleep(0.1)
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
    assert done.stderr.strip().endswith(
        "early: carry .gpu/pair/kit and .gpu/pair/manifest.json in this call")
    assert not (pair / "early.rc").exists() and not os.path.exists(tmp_path / "calls.txt")
