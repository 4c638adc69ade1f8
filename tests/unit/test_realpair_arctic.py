"""vLLM's own ``suffix`` mode in the real-pair grid (benchmarks/realpair/
arctic.py, run.py, grid.sh, host.sh): its engine arguments and environment
(vLLM's general plugins cut to this project's: never arctic_inference's
patches), the one line where arctic-inference is missing, what the result's
meta records, grid.sh's path for that mode alone (the grid goes on past a
failed mode) and host.sh's install into its own folder. CPU: a stand-in
``arctic_inference`` module and a stand-in python3 for the scripts."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from types import SimpleNamespace
import types
from importlib.metadata import EntryPoint

import pytest

from benchmarks.harness.meta import REPO_ROOT
from benchmarks.realpair import arctic, run

GRID = REPO_ROOT / "benchmarks/realpair/grid.sh"
HOST = REPO_ROOT / "benchmarks/realpair/host.sh"


def _args(mode: str, **more) -> argparse.Namespace:
    return run.mode_parser("test").parse_args(
        ["--cases", "c.jsonl.gz", "--target", "T", "--draft", "D", "--mode", mode,
         *[f"--{k}={v}" for k, v in more.items()]])


@pytest.fixture
def no_arctic(monkeypatch):
    """arctic_inference not importable, whatever this machine has."""
    monkeypatch.setitem(sys.modules, "arctic_inference", None)


@pytest.fixture
def fake_arctic(monkeypatch):
    """A stand-in arctic_inference whose cache drafts ``drafted`` (a list)."""
    drafted = [6, 9, 8, 1]

    class Cache:
        def __init__(self, **kw):
            pass

        def start_request(self, req_id, prompt):
            pass

        def add_active_response(self, req_id, ids):
            pass

        def speculate(self, req_id, context, **kw):
            return types.SimpleNamespace(token_ids=list(drafted))

        def stop_request(self, req_id):
            pass

    sub = types.ModuleType("arctic_inference.suffix_decoding")
    sub.SuffixDecodingCache = Cache
    monkeypatch.setitem(sys.modules, "arctic_inference", types.ModuleType("arctic_inference"))
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", sub)
    monkeypatch.setattr(arctic, "installed", lambda: {"version": "0.3.0", "path": "/a"})
    return drafted


def test_suffix_engine_kwargs_are_vllms_method_with_k_and_nothing_else():
    assert run.engine_kwargs("suffix", "T", "D", 6) == {
        "model": "T", "disable_log_stats": False,
        "speculative_config": {"method": "suffix", "num_speculative_tokens": 6}}


def test_suffix_mode_sets_only_this_projects_plugin(monkeypatch, fake_arctic):
    monkeypatch.setenv("VLLM_PLUGINS", "before")  # restored after the test
    kwargs = run.mode_kwargs(_args("suffix", k=5))
    assert os.environ["VLLM_PLUGINS"] == "specextend"
    assert kwargs["speculative_config"] == {"method": "suffix", "num_speculative_tokens": 5}


def test_the_plugin_named_is_this_projects_entry_point_and_not_arctics():
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    ours = pyproject["project"]["entry-points"]["vllm.general_plugins"]
    assert arctic.SUFFIX_ENV["VLLM_PLUGINS"].split(",") == list(ours)
    assert "arctic_inference" not in arctic.SUFFIX_ENV["VLLM_PLUGINS"].split(",")


def test_vllm_loads_only_the_named_plugin(monkeypatch):
    """vLLM's own selection (vllm/plugins/__init__.py) with both entry points
    present, as a full arctic-inference install registers its plugin."""
    import importlib.metadata

    import vllm.envs
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    points = [EntryPoint("specextend", "json:dumps", DEFAULT_PLUGINS_GROUP),
              EntryPoint("arctic_inference", "json:loads", DEFAULT_PLUGINS_GROUP)]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: points)
    monkeypatch.setenv("VLLM_PLUGINS", arctic.SUFFIX_ENV["VLLM_PLUGINS"])
    if hasattr(vllm.envs.__getattr__, "cache_clear"):
        vllm.envs.__getattr__.cache_clear()
    assert load_plugins_by_group(DEFAULT_PLUGINS_GROUP) == {"specextend": json.dumps}
    monkeypatch.delenv("VLLM_PLUGINS")
    if hasattr(vllm.envs.__getattr__, "cache_clear"):
        vllm.envs.__getattr__.cache_clear()
    assert set(load_plugins_by_group(DEFAULT_PLUGINS_GROUP)) == {"specextend",
                                                                  "arctic_inference"}


def test_missing_arctic_stops_the_suffix_mode_with_one_line_naming_the_fix(
        monkeypatch, no_arctic):
    monkeypatch.setenv("VLLM_PLUGINS", "before")
    with pytest.raises(SystemExit) as stop:
        run.mode_kwargs(_args("suffix"))
    message = str(stop.value.code)
    assert "\n" not in message and message.startswith("suffix mode: arctic_inference")
    assert "prepare.sh" in message and "host.sh build" in message
    assert os.environ["VLLM_PLUGINS"] == "before"


def test_other_modes_neither_need_arctic_nor_change_the_plugins(monkeypatch, no_arctic):
    monkeypatch.setenv("VLLM_PLUGINS", "before")
    run.mode_kwargs(_args("ngram"))
    assert os.environ["VLLM_PLUGINS"] == "before"


def test_meta_records_the_suffix_modes_environment_and_package(tmp_path, fake_arctic):
    args = _args("suffix")
    args.out = tmp_path / "r.json"
    run.write_result(args, {}, {"model": "T"}, 1.0, True, [])
    meta = json.loads((tmp_path / "r.json").read_text())["meta"]
    assert meta["mode_env"] == {"VLLM_PLUGINS": "specextend",
                                "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    assert meta["arctic_inference"] == {"version": "0.3.0", "path": "/a"}
    args = _args("ngram")
    args.out = tmp_path / "n.json"
    run.write_result(args, {}, {}, 1.0, True, [])
    meta = json.loads((tmp_path / "n.json").read_text())["meta"]
    assert meta["mode_env"] == {} and meta["arctic_inference"] is None


def test_check_drafts_from_the_prompt_or_fails(fake_arctic, capsys):
    assert arctic.main(["check"]) == 0
    assert "drafted [6, 9, 8, 1]" in capsys.readouterr().out
    fake_arctic[:] = [6, 9]
    assert arctic.main(["check"]) == 1
    assert "not [6, 9, 8, 1]" in capsys.readouterr().err


def test_check_without_arctic_fails_with_the_line(no_arctic, capsys):
    assert arctic.main(["check"]) == 1
    assert capsys.readouterr().err.startswith("suffix mode: arctic_inference")


# --------------------------------------------------------------------------- #
# grid.sh and host.sh, with a stand-in python3
# --------------------------------------------------------------------------- #
FAKE_PYTHON = textwrap.dedent("""\
    #!/bin/bash
    # run.py's stand-in: its path and mode; the suffix mode fails as run.py
    # does without arctic_inference.
    echo "PYTHONPATH=$PYTHONPATH ARGS=$*"
    while [ $# -gt 0 ]; do
      case $1 in --mode) mode=$2; shift ;; --k) k=$2; shift ;; esac; shift
    done
    if [ "${mode:-}" = suffix ] && [ -n "${FAIL_SUFFIX:-}" ]; then
      echo "suffix mode: arctic_inference is not importable (...): fix" >&2
      exit 1
    fi
    [ -z "${mode:-}" ] || echo "$mode k=$k copy:1024:1: 1 prompts"
    """)


def _bin(tmp_path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", FAKE_PYTHON), ("nvidia-smi", "#!/bin/bash\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def test_grid_puts_arctic_on_the_suffix_modes_path_alone_and_goes_on(tmp_path):
    env = {"PATH": _bin(tmp_path), "PYTHONPATH": "/repo:/root/vsite",
           "ARCTIC_DIR": "/x/arctic", "FAIL_SUFFIX": "1"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(GRID), str(out), "c", "T", "D", "ngram suffix plain:2",
                           "copy:1024:1"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "PYTHONPATH=/repo:/root/vsite:/x/arctic " in (out / "suffix_k4.log").read_text()
    for name in ("ngram_k4", "plain_k2"):
        assert "PYTHONPATH=/repo:/root/vsite " in (out / f"{name}.log").read_text()
    lines = done.stdout.splitlines()
    at = lines.index(next(x for x in lines if x.startswith("== suffix_k4")))
    assert lines[at + 1].startswith("rc=1 ")
    assert lines[at + 2].startswith("suffix mode: arctic_inference is not importable")
    assert lines[at + 3].startswith("== plain_k2") and lines[at + 4].startswith("rc=0 ")
    assert lines[at + 5] == "plain k=2 copy:1024:1: 1 prompts"
    assert lines[-1] == "done"
    assert sum(x.startswith("suffix mode:") for x in lines) == 1


def test_a_mode_with_its_own_cells_runs_those_alone(tmp_path):
    env = {"PATH": _bin(tmp_path), "PYTHONPATH": "/repo"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(GRID), str(out), "c", "T", "D",
                           "plain spec_extend_room320:20@copy:16384:8,other:16384:1",
                           "copy:30720:1 copy:16384:1"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    plain = (out / "plain_k4.log").read_text()
    assert "--cells copy:30720:1 copy:16384:1 --out" in plain
    room = (out / "spec_extend_room320_k20.log").read_text()
    assert "--k 20 --cells copy:16384:8 other:16384:1 --out" in room
    assert "== spec_extend_room320_k20 " in done.stdout


def test_a_mode_named_twice_is_refused_before_any_runs(tmp_path):
    env = {"PATH": _bin(tmp_path), "PYTHONPATH": "/repo"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(GRID), str(out), "c", "T", "D",
                           "plain spec_extend:20 spec_extend:20@copy:16384:8",
                           "copy:30720:1"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == ("grid.sh: spec_extend_k20 named twice: its files "
                                   "would overwrite each other")
    assert not list(out.glob("*.log"))


def _host_function() -> str:
    found = re.findall(r"^arctic_install\(\) \{\n.*?^\}\n", HOST.read_text(), re.S | re.M)
    assert len(found) == 1
    return found[0]


def _install(tmp_path, wheel: bool) -> subprocess.CompletedProcess:
    repo, target = tmp_path / "repo", tmp_path / "arctic"
    (repo / ".gpu/pair/kit").mkdir(parents=True)
    (target / "old").mkdir(parents=True)
    if wheel:
        (repo / ".gpu/pair/kit/arctic_inference-0.3.0-cp312-cp312-linux_x86_64.whl").touch()
    env = {"PATH": _bin(tmp_path), "PYTHONPATH": "/repo", "ARCTIC_DIR": str(target)}
    return subprocess.run(["bash", "-c", _host_function() + "arctic_install\necho rc=$?"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=60)


def test_host_installs_the_wheel_into_its_own_folder_and_checks_it(tmp_path):
    done = _install(tmp_path, wheel=True)
    target = tmp_path / "arctic"
    assert not target.exists()  # the old install removed; the fake pip makes none
    lines = done.stdout.splitlines()
    assert lines[0].endswith(f"-m pip install -q --no-index --no-deps --no-compile --target "
                             f"{target} .gpu/pair/kit/arctic_inference-0.3.0-cp312-cp312-"
                             "linux_x86_64.whl")
    assert lines[1] == f"PYTHONPATH=/repo:{target} ARGS=-m benchmarks.realpair.arctic check"
    assert lines[-1] == "rc=0"


def test_host_without_the_wheel_says_so_and_goes_on(tmp_path):
    done = _install(tmp_path, wheel=False)
    assert done.stdout.splitlines() == [
        "no arctic-inference wheel in .gpu/pair/kit: the suffix mode will fail "
        "(prepare.sh builds it)", "rc=0"]
    assert not (tmp_path / "arctic").exists()


# --- SuffixDecoding's cached responses, out before each cell (run.py) ---


class _Cache:
    def __init__(self, cached):
        self.cached_requests = set(cached)

    def evict_cached_response(self, req_id):
        self.cached_requests.remove(req_id)  # KeyError for one not cached


def test_every_cached_response_is_evicted():
    cache = _Cache({"a", "b", "c"})
    worker = SimpleNamespace(model_runner=SimpleNamespace(
        drafter=SimpleNamespace(suffix_cache=cache)))
    assert arctic.evict_responses(worker) == 3
    assert cache.cached_requests == set()
    assert arctic.evict_responses(worker) == 0


def test_the_suffix_mode_may_send_the_function():
    assert arctic.SUFFIX_ENV["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
