"""``python -m benchmarks.serve.bench_serve`` end to end on CPU: a plain server, a
SpecExtend server and the self_draft mode, every workload, two runs per
cell, real rejection sampling (so greedy outputs must match across servers).
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import background
import pytest
from cpu_serve import COMMON, ENV, SPEC_EXTEND

from benchmarks.serve import bench_serve

pytestmark = pytest.mark.server

REPO_ROOT = Path(__file__).resolve().parents[2]
MODES = ["plain", "spec_extend", "self_draft"]
WORKLOADS = ["long", "shared-doc", "short"]
OUTPUT_LENS = {"long": 24, "shared-doc": 16, "short": 8}
INPUT_LEN, CONCURRENCY, NUM_PROMPTS, RUNS, K = 512, 2, 2, 2, 3


def _serve_job(fixture):
    """One script run: two servers (and self_draft's), 3 workloads x 2 runs
    each (~7 min on 2 cores). ``long_prompts``: skips without the data."""
    fixture("long_prompts")
    tiny_target = fixture("tiny_target")
    out = fixture("tmp_path_factory").mktemp("bench_serve")
    cmd = [sys.executable, "-m", "benchmarks.serve.bench_serve",
           "--target", tiny_target, "--draft", tiny_target,
           "--modes", *MODES, "--workloads", *WORKLOADS,
           "--input-lens", str(INPUT_LEN), "--concurrency", str(CONCURRENCY),
           "--num-prompts", str(NUM_PROMPTS), "--runs", str(RUNS),
           "--long-output-len", str(OUTPUT_LENS["long"]),
           "--doc-output-len", str(OUTPUT_LENS["shared-doc"]),
           "--short-output-len", str(OUTPUT_LENS["short"]),
           "--num-spec-tokens", str(K), "--spec-extend", SPEC_EXTEND,
           "--startup-timeout", "300", "--out-dir", str(out), "--", *COMMON]
    # Bounds a hang: the run shares the machine with the rest of the suite.
    return lambda: (background.run(cmd, timeout=2400, env=ENV,
                                   stdin=subprocess.DEVNULL, cwd=REPO_ROOT), out)


BACKGROUND = {"bench_serve": _serve_job}


@pytest.fixture(scope="module")
def run(request):
    proc, out = background.result(request, "bench_serve")
    assert (out / "results.json").is_file(), proc.stdout[-4000:] + proc.stderr[-3000:]
    return proc, out, json.loads((out / "results.json").read_text())


def test_servers(run):
    proc, _, result = run
    servers = {s["mode"]: s for s in result["servers"]}
    assert list(servers) == MODES
    assert proc.returncode == 0, proc.stderr[-3000:]
    for mode in MODES:
        server = servers[mode]
        assert "error" not in server, server
        assert isinstance(server["async_scheduling"], bool)
        assert server["forced_stop"] == [] and server["log_errors"] == []
        assert server["jit_after_start"] == []  # no JIT monitor on CPU
        args = shlex.split(server["command"])
        # The servers differ in the speculation flags only.
        assert ("--speculative-config" in args) == (mode != "plain")
        assert ("--spec-extend" in args) == (mode != "plain")
        port = int(args[args.index("--port") + 1])
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))  # stopped
    plain, extend = (shlex.split(servers[m]["command"])
                     for m in ("plain", "spec_extend"))
    spec_flags = {"--speculative-config", "--spec-extend",
                  *(extend[extend.index(f) + 1] for f in ("--speculative-config",
                                                         "--spec-extend"))}
    drop_port = slice(None, -2)
    assert [a for a in extend if a not in spec_flags][drop_port] == plain[drop_port]


def test_cells_have_runs_and_every_request_completes(run):
    _, out, result = run
    rows = result["results"]
    assert sorted((r["mode"], r["workload"]) for r in rows) == sorted(
        (m, w) for m in MODES for w in WORKLOADS)
    for r in rows:
        assert (r["input_len"], r["concurrency"]) == (INPUT_LEN, CONCURRENCY)
        assert r["output_len"] == OUTPUT_LENS[r["workload"]]
        assert r["failed_requests"] == r["failed_runs"] == 0
        assert len(r["runs"]) == RUNS
        for key, source in bench_serve.FIGURES:
            stats = r[key]
            # A run whose every output came whole in its first streamed chunk
            # (the API server lagging on two cores merges chunks; 8-token
            # answers, up to 5 tokens a step) has no decode window, so no
            # decode tok/s (CI run 38 and a local run, 2026-11-29); any other
            # figure a run lacks is a bug.
            lacking = [run for run in r["runs"] if run.get(source) is None]
            assert all(key == "decode_tok_s" and run["decode_s"] == 0
                       for run in lacking), (key, r["mode"], r["workload"],
                                             [run.get(source) for run in r["runs"]])
            assert stats["n"] == RUNS - len(lacking)
            if stats["n"]:
                assert stats["min"] <= stats["median"] <= stats["max"]
        for x in r["runs"]:
            assert (x["completed"], x["failed"], x["errors"]) == (NUM_PROMPTS, 0, [])
            assert x["total_output_tokens"] == NUM_PROMPTS * r["output_len"]
            assert x["decode_tokens"] == NUM_PROMPTS * (r["output_len"] - 1)
            assert x["max_concurrency"] == CONCURRENCY
            if x["decode_s"] > 0:
                assert x["decode_tok_s"] > 0
            else:  # no decode window (above)
                assert x["decode_tok_s"] is None
            # Recorded in every run: None without NVML (a CPU host).
            assert x["gpu_busy"] is None or 0 <= x["gpu_busy"] <= 1
            assert (out / x["bench_result"]).is_file()


def test_plugin_only_in_its_mode_and_outputs_equal(run):
    _, _, result = run
    rows = {(r["mode"], r["workload"]): r for r in result["results"]}

    def total(row, name):
        return sum(x["server_metrics"].get(f"vllm:spec_extend_{name}_total", 0)
                   for x in row["runs"])

    for workload in WORKLOADS:
        plain = rows["plain", workload]
        assert plain["acceptance_length"] is None
        # The plugin is installed but not enabled: no SpecExtend series at
        # all, counters or gauges.
        assert not [k for x in plain["runs"] for k in x["server_metrics"]
                    if k.startswith("vllm:spec_extend_")]
        assert [x["spec_extend_series"] for x in plain["runs"]] == [[]] * RUNS
        for mode in ("spec_extend", "self_draft"):
            extend = rows[mode, workload]
            assert 1.0 <= extend["acceptance_length"] <= K + 1
            assert total(extend, "view_rows") > 0
            assert all("vllm:spec_extend_tracked_requests" in x["spec_extend_series"]
                       for x in extend["runs"])
            # Same prompts, greedy, real rejection sampling: the same texts.
            assert ([x["output_sha256"] for x in plain["runs"]]
                    == [x["output_sha256"] for x in extend["runs"]])
    assert total(rows["spec_extend", "long"], "retrievals") > 0


def test_summary_and_plots(run):
    _, out, result = run
    text = (out / "summary.md").read_text()
    for workload in WORKLOADS:
        assert f"### {workload}: {INPUT_LEN}-token inputs" in text
    assert f"| spec_extend | {CONCURRENCY} | {RUNS}/{RUNS} | 0 |" in text
    assert "| plain |" in text and "async scheduling" in text
    assert "| decode tok/s | GPU busy % |" in text
    if importlib.util.find_spec("matplotlib"):
        for workload in WORKLOADS:
            png = out / f"serve_{workload}_{INPUT_LEN}.png"
            assert png.read_bytes().startswith(b"\x89PNG")


def test_kernels_compiled_after_start_up_are_read_from_the_log(tmp_path):
    # Lines of an H200 server's log (serve/20261129T1137Z_*, self_draft).
    warn = ("(EngineCore pid=2641) WARNING 11-29 11:39:{} [jit_monitor.py:135] "
            "Triton kernel JIT compilation during inference: {}. This causes a "
            "latency spike; consider extending warmup to cover this shape/config.")
    log = tmp_path / "serve.log"
    log.write_text("\n".join([
        warn.format("23", "copy_and_expand_eagle_inputs_kernel"),  # start-up
        "(APIServer pid=2551) INFO 11-29 11:39:26 [api_server.py:677] Starting "
        "vLLM server on http://127.0.0.1:60825",
        warn.format("28", "_argmax_parts_kernel"),
        warn.format("31", "_block_lse_kernel"), ""]))
    assert bench_serve.jit_after_start(log) == ["_argmax_parts_kernel",
                                                "_block_lse_kernel"]
    log.write_text(warn.format("23", "x_kernel"))  # never started: nothing after
    assert bench_serve.jit_after_start(log) == []
    # --jit-monitor-verbose: every compile, on every tensor-parallel rank; a
    # kernel counts as often as one rank compiled it.
    start = ("(APIServer pid=2551) INFO 11-29 11:39:26 [api_server.py:677] "
             "Starting vLLM server on http://127.0.0.1:60825")
    ranks = [warn.format("28", "a_kernel"), warn.format("29", "b_kernel"),
             warn.format("30", "a_kernel")]
    other = [line.replace("EngineCore pid=2641", "Worker_TP1 pid=2700")
             for line in ranks]
    log.write_text("\n".join([start, *ranks, *other, ""]))
    assert bench_serve.jit_after_start(log) == ["a_kernel", "a_kernel", "b_kernel"]
    assert bench_serve.compiled(bench_serve.jit_after_start(log)) == (
        "a_kernel ×2, b_kernel")


def test_a_server_error_cell_names_its_cause():
    exited = ("vllm serve exited (2):\nmain.py: error: unrecognized arguments: "
              "--spec-extend {\"a\": 1}\nlast lines of /x/serve.log:\nusage: main.py\n")
    assert bench_serve.error_cell(exited) == (
        "vllm serve exited (2): main.py: error: unrecognized arguments: "
        "--spec-extend {\"a\": 1}")
    # No cause found: the first line alone, not the tail's heading.
    no_cause = "vllm serve exited (1):\nlast lines of /x:\nboom | x\n"
    assert bench_serve.error_cell(no_cause) == "vllm serve exited (1):"
    piped = bench_serve.error_cell("not healthy | in 300 s")
    assert piped == r"not healthy \| in 300 s"
