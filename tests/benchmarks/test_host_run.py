"""benchmarks/gpu/host_run.sh, the GPU host's entry, and its phases (one file
each in benchmarks/gpu/phases/, helpers in phases/common.sh): the dispatch
(every phase a file, every file a phase, an unknown phase refused with the
list before anything is installed); side_by_side: one evaluation process per
dataset (and length, where it names lengths), all at once, and the call fails
when any of them does; configs_side_by_side: such a set per configuration,
all at once, packed into one archive."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

from benchmarks.harness.meta import REPO_ROOT

# A python3 that stands in for `python3 -m benchmarks.longinput.eval_longinput run ...`:
# it announces itself, waits until every dataset's process has started (so
# processes run one after another would time out), writes its --out files.
FAKE_PYTHON = textwrap.dedent("""\
    #!/bin/bash
    argv=$(printf '<%s>' "$@")
    while [ $# -gt 0 ]; do
      case $1 in --datasets|--copy-sources) ds=$2; shift ;;
        --lengths|--copy-lengths) len=$2; shift ;;
        --out) out=$2; shift ;; esac; shift
    done
    touch "$MARKS/$(basename "$out")"
    for _ in $(seq 100); do
      [ "$(ls "$MARKS" | wc -l)" -ge "$EXPECT" ] && break; sleep 0.1
    done
    [ "$(ls "$MARKS" | wc -l)" -ge "$EXPECT" ] || { echo "ran alone" >&2; exit 9; }
    crash_var=CRASH_$ds; [ -n "${!crash_var:-}" ] && { echo "crashed" >&2; exit 7; }
    echo "{}" > "$out"; echo "table of $ds: $argv" > "${out%.json}.md"
    rc_var=RC_$ds; exit ${!rc_var:-0}
    """)


HOST_RUN = REPO_ROOT / "benchmarks/gpu/host_run.sh"
PHASES = REPO_ROOT / "benchmarks/gpu/phases"


def runner_files() -> list:
    """host_run.sh and every file of its phases (common.sh among them)."""
    return [HOST_RUN, *sorted(PHASES.glob("*.sh"))]


def runner_source() -> str:
    return "".join(path.read_text() for path in runner_files())


def function_source(name: str) -> str:
    """The shell function NAME, from whichever runner file defines it."""
    found = [m.group(0) for path in runner_files() for m in
             re.finditer(rf"^{name}\(\) \{{\n.*?^\}}\n", path.read_text(), re.S | re.M)]
    assert len(found) == 1, f"{name}() is defined {len(found)} times"
    return found[0]


def side_by_side_source() -> str:
    return function_source("side_by_side")


def run_script(tmp_path, script: str, processes: int,
               env_extra: dict) -> subprocess.CompletedProcess:
    """Run SCRIPT (host_run.sh functions and a call of one) with the fake
    python3 first on PATH, expecting PROCESSES evaluations at once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    for name in ("marks", "out"):
        (tmp_path / name).mkdir(exist_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"),
           "MARKS": str(tmp_path / "marks"), "EXPECT": str(processes), **env_extra}
    return subprocess.run(["bash", "-c", script + 'echo "rc=$?"\n'], env=env,
                          capture_output=True, text=True, timeout=60)


def run(tmp_path, env_extra: dict, datasets: str = "govreport pg19",
        args: str = "--target T --lengths 4096", lengths: str = "",
        tag: str = "grid23_4096") -> subprocess.CompletedProcess:
    script = (side_by_side_source()
              + f'side_by_side {tag} "{datasets}" "{lengths}" {args}\n')
    return run_script(tmp_path, script,
                      len(datasets.split()) * max(1, len(lengths.split())), env_extra)


def test_datasets_run_at_once_each_to_its_own_files(tmp_path):
    done = run(tmp_path, {})
    assert done.stdout.strip().endswith("rc=0"), done.stdout + done.stderr
    for ds in ("govreport", "pg19"):
        assert (tmp_path / "out" / f"grid23_4096_{ds}.json").exists()
        assert (tmp_path / "out" / f"grid23_4096_{ds}.log").exists()
        # Each process gets the call's arguments, its dataset, and is told
        # that it shares the GPU (its tok/s are no speed results).
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"table of {ds}:"))
        assert "<--target><T><--lengths><4096><--shared-gpu>" in line
        assert f"<--datasets><{ds}>" in line


def test_one_dataset_has_the_gpu_to_itself(tmp_path):
    done = run(tmp_path, {}, datasets="pg19")
    assert done.stdout.strip().endswith("rc=0"), done.stdout + done.stderr
    assert "--shared-gpu" not in done.stdout


def test_a_failing_dataset_fails_the_call(tmp_path):
    for failing, code in (("pg19", "3"), ("govreport", "4")):
        done = run(tmp_path / failing, {f"RC_{failing}": code})
        assert done.stdout.strip().endswith(f"rc={code}"), done.stdout + done.stderr
        assert "table of govreport" in done.stdout and "table of pg19" in done.stdout


def test_datasets_are_named_once(tmp_path):
    done = run(tmp_path, {}, args="--target T --datasets pg19")
    assert done.stdout.strip().endswith("rc=2")
    assert "not --datasets" in done.stderr
    done = run(tmp_path, {}, datasets=" ")
    assert done.stdout.strip().endswith("rc=2")
    assert "no datasets" in done.stderr


def test_each_length_of_each_dataset_runs_at_once_each_to_its_own_files(tmp_path):
    import tarfile

    done = run(tmp_path, {}, args="--target T", lengths="2048 4096", tag="grid23")
    assert done.stdout.strip().endswith("rc=0"), done.stdout + done.stderr
    # Four processes' 12 files would pass a call's 8: they come back packed.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["grid23.tgz"]
    with tarfile.open(tmp_path / "out" / "grid23.tgz") as tar:
        assert len(tar.getnames()) == 12
        tar.extractall(tmp_path / "out", filter="data")
    for ds in ("govreport", "pg19"):
        for length in ("2048", "4096"):
            assert (tmp_path / "out" / f"grid23_{length}_{ds}.json").exists()
            line = next(x for x in done.stdout.splitlines()
                        if x.startswith(f"table of {ds}:") and f"<--lengths><{length}>" in x)
            assert "<--target><T><--shared-gpu>" in line


def test_one_length_of_one_dataset_has_the_gpu_to_itself(tmp_path):
    done = run(tmp_path, {}, datasets="pg19", args="--target T", lengths=" 8192 ",
               tag="grid23")
    assert done.stdout.strip().endswith("rc=0"), done.stdout + done.stderr
    assert (tmp_path / "out" / "grid23_8192_pg19.json").exists()
    assert "--shared-gpu" not in done.stdout


def test_lengths_are_named_once(tmp_path):
    done = run(tmp_path, {}, args="--target T --lengths 4096", lengths="2048", tag="grid23")
    assert done.stdout.strip().endswith("rc=2")
    assert "not --lengths" in done.stderr


def test_a_process_that_left_no_results_is_packed_with_the_rest(tmp_path):
    """A process that fails before it writes (a crash, a timeout) leaves only
    its log: the pack holds what exists, so nothing stays loose to pass a
    call's 8 files, and its log comes back."""
    import tarfile

    done = run(tmp_path, {"CRASH_pg19": "1"}, args="--target T", lengths="2048 4096",
               tag="grid23")
    assert done.stdout.strip().endswith("rc=7"), done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["grid23.tgz"]
    with tarfile.open(tmp_path / "out" / "grid23.tgz") as tar:
        names = set(tar.getnames())
    assert {"grid23_2048_pg19.log", "grid23_4096_pg19.log"} <= names
    assert "grid23_2048_pg19.json" not in names and len(names) == 8


def test_copy_tasks_name_sources_and_lengths_with_their_own_flags(tmp_path):
    """copy46: a process per source and length, named with the copy tasks'
    flags (the eval's --datasets / --lengths would leave them at defaults)."""
    flags = {"SIDE_BY_SIDE_DATASETS": "--copy-sources",
             "SIDE_BY_SIDE_LENGTHS": "--copy-lengths"}
    done = run(tmp_path, flags, datasets="govreport pydoc", args="--target T",
               lengths="2048", tag="copy46")
    assert done.stdout.strip().endswith("rc=0"), done.stdout + done.stderr
    for ds in ("govreport", "pydoc"):
        assert (tmp_path / "out" / f"copy46_2048_{ds}.json").exists()
        line = next(x for x in done.stdout.splitlines()
                    if x.startswith(f"table of {ds}:"))
        assert f"<--copy-sources><{ds}><--copy-lengths><2048>" in line
        assert "<--datasets>" not in line and "<--lengths>" not in line
    done = run(tmp_path / "twice", flags, args="--target T --copy-sources pg19")
    assert done.stdout.strip().endswith("rc=2")
    assert "not --copy-sources" in done.stderr


def test_blank_lists_run_nothing(tmp_path):
    done = run(tmp_path, {}, datasets="\t")
    assert done.stdout.strip().endswith("rc=2")
    assert "no datasets" in done.stderr


def run_configs(tmp_path, env_extra: dict, configs: list[str],
                datasets: str = "govreport pg19") -> subprocess.CompletedProcess:
    quoted = " ".join(f"'{c}'" for c in configs)
    script = (side_by_side_source() + function_source("configs_side_by_side")
              + f'configs_side_by_side fp8draft "none draft_model cmr" {quoted}\n')
    return run_script(tmp_path, script, len(datasets.split()) * len(configs),
                      {"OPTIONS_DATASET": datasets, **env_extra})


def test_configs_run_at_once_each_with_its_draft_and_config(tmp_path):
    """Two configurations over two datasets are four processes at once (one
    waits for all four), each with its own draft and plugin config, and their
    files come back as one archive, nothing loose beside it."""
    import tarfile

    # what the phase wrote before (its builds' logs) goes into the archive too
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "fp8draft_build.log").write_text("built\n")
    done = run_configs(tmp_path, {}, ["bf16|/m/target|{}",
                                      'fp8|/m/target_fp8|{"top_k": 8}'])
    assert done.stdout.strip().endswith("rc=0"), done.stdout + done.stderr
    tables = [line for line in done.stdout.splitlines() if line.startswith("table of")]
    assert len(tables) == 4
    # each argument whole: the modes apart, the JSON config in one piece
    fp8 = [t for t in tables if "<--draft></m/target_fp8>" in t]
    assert len(fp8) == 2 and all('<--spec-extend><{"top_k": 8}>' in t for t in fp8)
    assert all("<--modes><none><draft_model><cmr><--working-sets><512>" in t
               for t in tables)
    assert all("<--lengths><8192>" in t for t in tables)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fp8draft.tgz"]
    with tarfile.open(tmp_path / "out" / "fp8draft.tgz") as tar:
        names = set(tar.getnames())
    assert "fp8draft_build.log" in names
    for cfg in ("bf16", "fp8"):
        assert f"fp8draft_{cfg}.txt" in names
        for ds in ("govreport", "pg19"):
            assert {f"fp8draft_{cfg}_8192_{ds}.{ext}" for ext in ("json", "md", "log")} <= names


def test_a_failing_configuration_fails_the_call_and_is_packed(tmp_path):
    import tarfile

    done = run_configs(tmp_path, {"CRASH_pg19": "1"},
                       ["bf16|/m/target|{}", "fp8|/m/target_fp8|{}"])
    assert done.stdout.strip().endswith("rc=7"), done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["fp8draft.tgz"]
    with tarfile.open(tmp_path / "out" / "fp8draft.tgz") as tar:
        names = set(tar.getnames())
    assert "fp8draft_fp8_8192_pg19.log" in names
    assert "fp8draft_fp8_8192_pg19.json" not in names


def serve_traffic(env: dict, function: str = "serve_traffic") -> list[str]:
    """The flags serve12's serve_traffic (or ``function``) gives
    bench_serve under ``env``."""
    script = function_source(function) + function
    done = subprocess.run(["bash", "-c", script],
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True,
                          text=True, timeout=30, check=True)
    return done.stdout.split()


def test_serve12_traffic_bursts_or_rates():
    """serve12 runs bursts as before; with SERVE_RATES, Poisson arrivals at
    each rate with their labels and SLOs, flags bench_serve takes."""
    from benchmarks.serve import bench_serve

    assert serve_traffic({}) == ["--concurrency", "1", "4", "--num-prompts", "1", "4"]
    assert serve_traffic({"SERVE_CONCURRENCY": "16", "SERVE_PROMPTS": "32"}) == [
        "--concurrency", "16", "--num-prompts", "32"]
    flags = serve_traffic({"SERVE_RATES": "0.5 1", "SERVE_LOAD": "high",
                           "SERVE_CONCURRENCY": "16"})
    assert flags == ["--request-rates", "0.5", "1", "--load", "high", "--goodput",
                     "ttft:20000", "tpot:50", "--num-prompts", "32"]
    args = bench_serve.parse_args(["--target", "T", "--modes", "plain",
                                   "--out-dir", "x", *flags])
    assert bench_serve.traffics(args) == [bench_serve.Traffic(None, 32, 0.5, "high"),
                                          bench_serve.Traffic(None, 32, 1.0, "high")]
    assert serve_traffic({"SERVE_RATES": "2", "SERVE_GOODPUT": "e2el:60000",
                          "SERVE_PROMPTS": "64"}) == [
        "--request-rates", "2", "--goodput", "e2el:60000", "--num-prompts", "64"]


def test_tp_flags_give_the_size_the_executor_and_the_fusion_off():
    """tp_flags SIZE [EXECUTOR], what tp-speed, profile26 and serve12 give
    their engines and servers: the size, the executor (mp unless named) and
    the fusion off, as flags vLLM's engine arguments parse; nothing at 1."""
    import json

    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    def tp_flags(*args: str) -> list[str]:
        script = function_source("tp_flags") + " ".join(["tp_flags", *args])
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              timeout=30, check=True).stdout.split()

    assert tp_flags() == [] and tp_flags("1") == []
    flags = tp_flags("4", "ray")
    args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(flags)
    assert args.tensor_parallel_size == 4
    assert args.distributed_executor_backend == "ray"
    assert json.loads(flags[flags.index("--compilation-config") + 1]) == {
        "pass_config": {"fuse_allreduce_rms": False}}
    assert tp_flags("2")[3] == "mp"
    # Every phase that runs across GPUs takes its flags from it.
    source = runner_source()
    assert source.count("$(tp_flags ") == 3
    assert source.count("fuse_allreduce_rms") == 1


def test_tp_fusion_turns_the_fusion_on_with_trtllm_only():
    """TP_FUSION=trtllm: the fusion on, FlashInfer's trtllm backend named (an
    A/B, issue #44); any other value, mnnvl above all (it calls
    cuMulticastCreate, which these hosts forbid), stops the call."""
    import json

    source = runner_source()
    check = re.search(r'^case "\$\{TP_FUSION:-\}" in\n.*?^esac\n', source,
                      re.S | re.M).group(0)
    script = (check + function_source("tp_flags")
              + 'tp_flags 2; echo "backend=$VLLM_FLASHINFER_ALLREDUCE_BACKEND"')

    def run(value: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "TP_FUSION": value}
        env.pop("VLLM_FLASHINFER_ALLREDUCE_BACKEND", None)
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              timeout=30, env=env)

    on = run("trtllm")
    flags = on.stdout.split()
    assert on.returncode == 0 and flags[-1] == "backend=trtllm"
    assert json.loads(flags[flags.index("--compilation-config") + 1]) == {
        "pass_config": {"fuse_allreduce_rms": True}}
    off = run("")
    flags = off.stdout.split()
    assert off.returncode == 0 and flags[-1] == "backend="
    assert json.loads(flags[flags.index("--compilation-config") + 1]) == {
        "pass_config": {"fuse_allreduce_rms": False}}
    refused = run("mnnvl")
    assert refused.returncode == 2 and "multicast" in refused.stderr


def test_a_test_that_runs_a_phase_stands_in_for_pkill():
    """A phase's stop_leftovers runs ``pkill -KILL -f '…|^VLLM::'``: right on
    a GPU host, but on the CI machine it kills every vLLM process, the
    engines other tests are starting (2026-11-28/29, docs/testing.md). Each
    test file that runs host_run.sh as a script with a phase must put a
    ``pkill`` of its own first on the PATH."""
    runs_a_phase = re.compile(r'"(?:benchmarks/gpu/)?host_run\.sh",\s*"\w')
    for path in sorted((REPO_ROOT / "tests").rglob("test_*.py")):
        text = path.read_text()
        if runs_a_phase.search(text):
            assert re.search(r'\("pkill",', text), (
                f"{path.relative_to(REPO_ROOT)} runs a host_run.sh phase with "
                "the real pkill on its PATH")


# The phases host_run.sh had when they moved into files of their own (issue
# #71): the command line keeps every one of them.
PHASES_OF_ISSUE_71 = {
    "viewattn", "prefillfloor", "kernels", "gpu-tests", "graph-tests", "decode26",
    "profile26", "self-draft", "decode15", "eagle3", "capture", "tp-lossless",
    "tp-speed", "tp-tests", "serve12", "rate45", "soak21", "pair", "eval",
    "analyses", "needle", "gguf", "options", "pool45", "fp8draft", "grid23",
    "copy46"}
# Stand-ins for what the preamble and a phase would reach on a GPU host: each
# logs its arguments to $MARKS/NAME; python3 exits with $PY_RC. pkill and
# pgrep likewise (the real ones would reach this machine's vLLM processes).
STAND_IN = '#!/bin/bash\necho "$*" >> "$MARKS/$(basename "$0")"\nexit ${PY_RC:-0}\n'


def call_host_run(tmp_path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    bin_dir, marks, out = tmp_path / "bin", tmp_path / "marks", tmp_path / "out"
    for folder in (bin_dir, marks, out):
        folder.mkdir(parents=True, exist_ok=True)
    for name in ("python3", "nvidia-smi", "pkill", "pgrep"):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(out), "MARKS": str(marks),
           "DETACHED_ROOT": str(tmp_path / "det"), **extra}
    return subprocess.run(["bash", str(HOST_RUN.relative_to(REPO_ROOT)), *args],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def listed_phases(stderr: str) -> list:
    line = next(x for x in stderr.splitlines() if x.startswith("usage: host_run.sh"))
    return line.split("one of:", 1)[1].split()


def test_host_run_is_an_entry_of_at_most_300_lines():
    assert len(HOST_RUN.read_text().splitlines()) <= 300


def test_every_runner_file_parses():
    for path in runner_files():
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, f"{path.relative_to(REPO_ROOT)}: {done.stderr}"


def test_every_phase_is_a_file_and_every_file_a_phase(tmp_path):
    """The list an unknown phase gets is the phases/ folder, common.sh aside;
    each phase file says what it measures and what it feeds, and so runs;
    the phases of issue #71 are all still there, and so is every phase a
    phase runs itself (rate45: `bash "$0" serve12`)."""
    done = call_host_run(tmp_path)
    files = sorted(p.stem for p in PHASES.glob("*.sh") if p.name != "common.sh")
    assert done.returncode == 2
    assert sorted(listed_phases(done.stderr)) == files
    assert PHASES_OF_ISSUE_71 <= set(files)
    for name in files:
        head = (PHASES / f"{name}.sh").read_text().splitlines()
        assert head[0].startswith(f"# host_run.sh {name}: "), name
        assert any(line.startswith("# Feeds: ") for line in head[:6]), name
    nested = re.findall(r'bash "\$0" ([\w-]+)', runner_source())
    assert nested and set(nested) <= set(files)


def test_an_unknown_phase_stops_before_the_install_with_the_list(tmp_path):
    for args, said in ((("nosuch",), "no phase named 'nosuch'"),
                       (("common",), "no phase named 'common'"),
                       (("../detached",), "no phase named '../detached'"),
                       ((), "usage: host_run.sh")):
        done = call_host_run(tmp_path / str(len(said)), *args)
        assert done.returncode == 2, done.stdout + done.stderr
        assert said in done.stderr
        assert set(listed_phases(done.stderr)) >= PHASES_OF_ISSUE_71
        # nothing installed, nothing asked of the GPU
        assert not list((tmp_path / str(len(said)) / "marks").iterdir())
        assert not list((tmp_path / str(len(said)) / "out").iterdir())


def test_a_phase_runs_in_the_entry_after_its_preamble(tmp_path):
    """A known phase runs after the install and the GPU's name, with the
    preamble's variables; its exit status is the call's."""
    done = call_host_run(tmp_path, "viewattn", PY_RC="5")
    assert done.returncode == 5, done.stdout + done.stderr
    assert "viewattn rc=5" in done.stdout
    calls = (tmp_path / "marks" / "python3").read_text().splitlines()
    assert calls[0].startswith("-m pip install") and "--target /root/vsite" in calls[0]
    assert calls[1].startswith("-m benchmarks.gpu.view_attention_bench --out ")
    assert (tmp_path / "out" / "gpu.txt").exists()
    # a phase with no `exit` of its own ends with its last command's status
    # (capture: its grep of pytest's output, under pipefail; the stand-in
    # wrote none, so 1)
    done = call_host_run(tmp_path / "capture", "capture")
    assert done.returncode == 1, done.stdout + done.stderr
    calls = (tmp_path / "capture" / "marks" / "python3").read_text()
    assert "-m pytest tests/kernels/test_capture_gpu.py -q -x" in calls
    assert (tmp_path / "capture" / "out" / "capture.txt").exists()
