"""``python -m benchmarks.bench_serve`` end to end on CPU: ``vllm bench serve``
against a draft_model server and a SpecExtend server.

The tiny target drafts for itself: with its full KV the draft proposes exactly
what the target picks (greedy), so draft_model accepts nearly everything, while
SpecExtend's view changes what the draft sees and its acceptance drops. That
makes the acceptance columns, not only the SpecExtend counters, show which
server drafted through views.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_serve import COMMON, ENV, SPEC_EXTEND

from benchmarks import bench_serve

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.server

MODES = ["draft_model", "spec_extend"]
CONCURRENCY = [1, 4]
NUM_PROMPTS = [4, 8]
OUTPUT_LEN = 32


@pytest.fixture(scope="module")
def run(tiny_target, long_prompts, tmp_path_factory):
    """One script run: two servers, two concurrencies each (~4 min on 2 cores)."""
    out = tmp_path_factory.mktemp("bench_serve")
    cmd = [sys.executable, "-m", "benchmarks.bench_serve", "--target", tiny_target, "--draft", tiny_target,
           "--modes", *MODES, "--concurrency", *map(str, CONCURRENCY),
           "--num-prompts", *map(str, NUM_PROMPTS), "--input-len", "1024",
           "--output-len", str(OUTPUT_LEN), "--num-spec-tokens", "3",
           "--spec-extend", SPEC_EXTEND, "--startup-timeout", "300",
           "--out-dir", str(out), "--", *COMMON]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=ENV,
                          stdin=subprocess.DEVNULL, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text())["runs"]


def test_every_request_completes(run):
    out, rows = run
    assert [(r["mode"], r["concurrency"]) for r in rows] == [
        (m, c) for m in MODES for c in CONCURRENCY]
    for r, n in zip(rows, NUM_PROMPTS * len(MODES), strict=True):
        assert "error" not in r, r["error"]
        assert (r["completed"], r["failed"], r["errors"]) == (n, 0, [])
        assert r["total_output_tokens"] == n * OUTPUT_LEN  # --ignore-eos
        assert r["max_concurrency"] == r["concurrency"]
        assert (out / r["bench_result"]).is_file()


def test_acceptance_and_views(run):
    _, rows = run
    by_mode = {m: [r for r in rows if r["mode"] == m] for m in MODES}
    for r in rows:
        assert r["spec_decode_num_drafts"] > 0
        assert r["acceptance_length"] == pytest.approx(
            1 + r["spec_decode_accepted_tokens"] / r["spec_decode_num_drafts"])
    full = by_mode["draft_model"]
    assert min(r["acceptance_rate"] for r in full) >= 0.9
    views = by_mode["spec_extend"]
    assert (max(r["acceptance_rate"] for r in views)
            < min(r["acceptance_rate"] for r in full))

    def total(mode_rows, name):
        return sum(r["server_metrics"].get(f"vllm:spec_extend_{name}_total", 0)
                   for r in mode_rows)

    # The draft_model server must not have enabled the plugin's worker.
    assert total(full, "decode_rows") == total(full, "retrievals") == 0
    assert total(views, "retrievals") > 0
    assert total(views, "view_rows") > 0
    assert (0 < total(views, "draft_context_tokens")
            < total(views, "full_context_tokens"))


def test_commands_and_servers_stopped(run):
    """Only the speculation flags differ, and no server outlives the script."""
    _, rows = run
    for r in rows:
        args = shlex.split(r["serve_command"])
        assert "--speculative-config" in args
        assert ("--spec-extend" in args) == (r["mode"] == "spec_extend")
        port = int(args[args.index("--port") + 1])
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))
    dm, se = (shlex.split(rows[i]["serve_command"]) for i in (0, len(CONCURRENCY)))
    strip = {"--spec-extend", SPEC_EXTEND}
    assert [a for a in se if a not in strip][:-1] == dm[:-1]  # all but the port


def test_summary_and_plot(run):
    out, rows = run
    lines = (out / "summary.md").read_text().splitlines()
    for r in rows:
        line = next(ln for ln in lines
                    if ln.startswith(f"| {r['mode']} | {r['concurrency']} |"))
        assert f"| {r['completed']} / 0 |" in line
        assert f"{100 * r['acceptance_rate']:.1f}%" in line
    if importlib.util.find_spec("matplotlib"):
        assert (out / "serve.png").read_bytes().startswith(b"\x89PNG")


def test_serve_args_per_mode():
    args = bench_serve.parse_args(
        ["--target", "T", "--draft", "D", "--acceptance-length", "3", "--out-dir", "x",
         "--", "--load-format", "dummy"])
    plain, draft_model, spec_extend = (bench_serve.serve_args(args, m)
                                       for m in ("plain", "draft_model", "spec_extend"))
    assert plain == ["T", "--tokenizer", "T", "--seed", "0", "--load-format", "dummy"]
    spec = json.loads(draft_model[draft_model.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": "D", "num_speculative_tokens": 4,
                    "rejection_sample_method": "synthetic",
                    "synthetic_acceptance_length": 3.0}
    assert "--spec-extend" not in draft_model
    assert spec_extend[:len(draft_model) - 2] == draft_model[:-2]
    assert spec_extend[-4:] == ["--spec-extend", args.spec_extend,
                                "--load-format", "dummy"]


def test_acceptance_from_counters():
    """Without vLLM bench's spec-decode fields, the server's counters count."""
    delta = {"vllm:spec_decode_num_drafts_total": 10.0,
             "vllm:spec_decode_num_draft_tokens_total": 40.0,
             "vllm:spec_decode_num_accepted_tokens_total": 20.0}
    assert bench_serve.acceptance({}, delta) == (0.5, 3.0)
    bench = {"spec_decode_acceptance_rate": 25.0, "spec_decode_acceptance_length": 2.0}
    assert bench_serve.acceptance(bench, delta) == (0.25, 2.0)
    assert bench_serve.acceptance({}, {}) == (None, None)
