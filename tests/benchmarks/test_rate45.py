"""benchmarks/gpu/host_run.sh's rate45: issue #45's rate table on a 4-GPU
host, a detached serve12 a GPU, run here with stand-ins for vLLM's bench and
nvidia-smi: the four jobs (or RATE45_JOBS's) run at once, each on its GPU
with its modes, rate, load and config; a later call collects them in at most
8 files; an unknown detached run beside them stops the phase before any job
starts."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import textwrap

from benchmarks.harness.meta import REPO_ROOT

# Stands in for `python3 -m benchmarks.serve.bench_serve ...` (waits until all
# four have started, so jobs run one after another would time out) and for
# `pip install`; anything else goes to the real python.
FAKE_PYTHON = textwrap.dedent(f"""\
    #!/bin/bash
    case "$1 $2" in
      "-m pip") exit 0 ;;
      "-m benchmarks.serve.bench_serve")
        argv="$*"
        while [ $# -gt 0 ]; do case $1 in --out-dir) out=$2; shift ;; esac; shift; done
        mkdir -p "$out"; echo "$CUDA_VISIBLE_DEVICES|$argv" > "$out/args.txt"
        if [ -n "${{HOLD:-}}" ]; then
          mkdir -p "$out/bench"; echo '{{}}' > "$out/bench/run0.json"
          while [ ! -f "$HOLD" ]; do sleep 0.1; done
        fi
        touch "$MARKS/$CUDA_VISIBLE_DEVICES"
        n=${{EXPECT_JOBS:-4}}
        for _ in $(seq 100); do [ "$(ls "$MARKS" | wc -l)" -ge $n ] && break; sleep 0.1; done
        [ "$(ls "$MARKS" | wc -l)" -ge $n ] || {{ echo "ran alone" >&2; exit 9; }}
        echo '{{}}' > "$out/results.json"
        echo "| plain | 0.48 | high | 3/3 |" > "$out/summary.md"
        touch "$out/serve_rate_long_32768.png"; exit 0 ;;
    esac
    exec {sys.executable} "$@"
    """)
FAKE_NVIDIA_SMI = "#!/bin/bash\ncase \"$*\" in *compute-apps*) exit 0 ;; esac\necho GPU\n"
# Stand in for pkill and pgrep: the phase's stop_leftovers must never reach
# this machine's processes. With the real pkill it SIGKILLed every process
# titled VLLM::* here, the engines other tests were starting beside it (CI's
# silent engine deaths of 2026-11-28/29: perf's signal_generate tracepoint
# named pkill as the sender). They log their arguments and match nothing.
FAKE_PKILL = '#!/bin/bash\necho "$(basename "$0") $*" >> "$MARKS/../pkill.log"\nexit 1\n'


def call(tmp_path, wait_s: int, **extra: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("python3", FAKE_PYTHON), ("nvidia-smi", FAKE_NVIDIA_SMI),
                       ("pkill", FAKE_PKILL), ("pgrep", FAKE_PKILL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "out"
    if out.exists():  # each device call starts with an empty $OUT
        subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir()
    (tmp_path / "marks").mkdir(exist_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(out), "TMPDIR": str(tmp_path),
           "MARKS": str(tmp_path / "marks"), "DETACHED_ROOT": str(tmp_path / "det"),
           "RATE45_WAIT_S": str(wait_s), **extra}
    return subprocess.run(["bash", "benchmarks/gpu/host_run.sh", "rate45"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_four_jobs_at_once_then_collected_in_eight_files(tmp_path):
    first = call(tmp_path, 1)
    assert first.returncode == 0, first.stdout + first.stderr
    # The first call stopped the leftovers, through the stand-ins only.
    assert "pkill -KILL -f" in (tmp_path / "pkill.log").read_text()
    second = call(tmp_path, 60)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.count(" rc=0") == 4, second.stdout
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    tags = ["draft_model-self_draft-long-32768-o512-r0.48-high",
            "plain-spec_extend-long-32768-o512-r0.24-low",
            "plain-spec_extend-long-32768-o512-r0.48-high",
            "plain-spec_extend-long-32768-o512-r0.48-high-pooled"]
    assert files == sorted(f"serve12_{t}.{ext}" for t in tags for ext in ("log", "tgz"))
    jobs = {}
    for tag in tags:
        with tarfile.open(tmp_path / "out" / f"serve12_{tag}.tgz") as tar:
            text = tar.extractfile(f"serve12_{tag}/args.txt").read().decode()
        gpu, argv = text.strip().split("|", 1)
        jobs[gpu] = (tag, argv)
    assert jobs["0"][0].endswith("r0.48-high")
    assert jobs["2"][0].endswith("r0.24-low") and "--load low" in jobs["2"][1]
    assert jobs["3"][0].startswith("draft_model-self_draft")
    assert '"draft_prompt_pool": "auto"' in jobs["1"][1]  # the default: the full pass
    assert all("draft_prompt_pool" not in jobs[g][1] for g in "023")
    assert all("--long-output-len 512" in a and "--input-lens 32768" in a
               and "--draft .gpu/models/llama32_1b " in a for _, a in jobs.values())


def test_other_jobs_two_gpus(tmp_path):
    jobs = "0|draft_model self_draft|high|high;1|draft_model|low|low||half|llama_68m"
    for wait_s in (1, 60):
        done = call(tmp_path, wait_s, RATE45_JOBS=jobs, EXPECT_JOBS="2")
        assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" rc=0") == 2, done.stdout
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    tags = ["draft_model-self_draft-long-32768-o512-r0.48-high",
            "draft_model-llama_68m-long-32768-o512-r0.24-low-half"]
    assert files == sorted(f"serve12_{t}.{ext}" for t in tags for ext in ("log", "tgz"))
    with tarfile.open(tmp_path / "out" / f"serve12_{tags[1]}.tgz") as tar:
        text = tar.extractfile(f"serve12_{tags[1]}/args.txt").read().decode()
    gpu, argv = text.strip().split("|", 1)
    assert gpu == "1" and "--modes draft_model" in argv and "--load low" in argv
    assert "--draft .gpu/models/llama_68m " in argv


def test_a_cell_still_running_brings_back_its_finished_runs(tmp_path):
    hold = tmp_path / "release"
    extra = {"RATE45_JOBS": "0|draft_model|high|high", "EXPECT_JOBS": "1",
             "HOLD": str(hold)}
    running = call(tmp_path, 2, **extra)
    assert running.returncode == 0, running.stdout + running.stderr
    assert "still running" in running.stdout
    tag = "draft_model-long-32768-o512-r0.48-high"
    with tarfile.open(tmp_path / "out" / f"serve12_{tag}_partial.tgz") as tar:
        assert tar.getnames() == ["bench", "bench/run0.json"]
    hold.touch()
    done = call(tmp_path, 60, **extra)
    assert done.returncode == 0 and " rc=0" in done.stdout, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        f"serve12_{tag}.log", f"serve12_{tag}.tgz"]


def test_an_unknown_detached_run_stops_the_phase(tmp_path):
    other = tmp_path / "det" / "soak21_x"
    other.mkdir(parents=True)
    (other / "started").touch()
    done = call(tmp_path, 1)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "a detached run is going (soak21_x)" in done.stderr
    assert sorted(p.name for p in (tmp_path / "det").iterdir()) == ["soak21_x"]
