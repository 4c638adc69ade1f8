"""``python -m benchmarks.decode.bench_decode`` end to end on CPU (fp32, real rejection
sampling): every mode on vLLM's default engine (its core in its own process),
two runs per cell, the plugin's counters from the workers, greedy outputs
equal across modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import background
import pytest

from benchmarks.decode import bench_decode

pytestmark = pytest.mark.engine

REPO_ROOT = Path(__file__).resolve().parents[2]
MODES = ["plain", "draft_model", "spec_extend", "self_draft"]
CONTEXTS, BATCHES, RUNS, OUTPUT_LEN, K = [512, 1024], [1, 2], 2, 16, 3
SPEC_EXTEND = {"top_k": 4, "recent_tokens": 64, "min_context": 256,
               "draft_prompt_pool": "auto"}  # the pool's resolution, recorded
# Fits the head's 256 positions with K=3 (working set 206).
EAGLE_SPEC_EXTEND = {"top_k": 2, "recent_tokens": 64, "retrieve_every": 2,
                     "min_context": 256}
CPU = ["--load-format", "auto", "--dtype", "float32", "--acceptance-length", "0",
       "--enforce-eager", "--kv-cache-memory-bytes", "1000000000", "--block-size", "32"]


def bench(out: Path, *args: str):
    """The job of one script run (``background.py``), writing ``out``."""
    env = dict(os.environ)
    # In-process engine tests of this session set it; users' runs do not.
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    env["PYTHONFAULTHANDLER"] = "1"  # a process killed by a signal shows where
    cmd = [sys.executable, "-m", "benchmarks.decode.bench_decode", *CPU, *args,
           "--out", str(out)]
    # Bounds a hang: the run shares the machine with the rest of the suite.
    return lambda: background.run(cmd, timeout=1800, env=env, stdin=subprocess.DEVNULL,
                                  cwd=REPO_ROOT)


def _decode_job(fixture):
    """All four modes, two contexts x two batch sizes (~4 min on 2 cores)."""
    out = fixture("tmp_path_factory").mktemp("bench_decode") / "decode.json"
    job = bench(out, "--target-config", fixture("tiny_target"),
                "--draft-config", fixture("tiny_draft"),
                "--modes", *MODES, "--contexts", *map(str, CONTEXTS),
                "--batch-sizes", *map(str, BATCHES), "--runs", str(RUNS),
                "--output-len", str(OUTPUT_LEN), "--num-spec-tokens", str(K),
                "--spec-extend", json.dumps(SPEC_EXTEND), "--draft-timing")
    return lambda: (job(), out)


def _eagle3_job(fixture):
    """The 256-position EAGLE-3 head on 1024-token prompts (~2 min)."""
    out = fixture("tmp_path_factory").mktemp("bench_decode_eagle3") / "decode.json"
    job = bench(out, "--target-config", fixture("tiny_target"),
                "--draft-config", fixture("tiny_short_eagle3"), "--method", "eagle3",
                "--modes", "draft_model", "spec_extend",
                "--spec-extend", json.dumps(EAGLE_SPEC_EXTEND),
                "--contexts", "1024", "--batch-sizes", "1", "--runs", "1",
                "--output-len", "16", "--num-spec-tokens", "3", "--draft-timing",
                "--eagle-v1-baseline")
    return lambda: (job(), out)


BACKGROUND = {"decode": _decode_job, "eagle3": _eagle3_job}


@pytest.fixture(scope="module")
def decode_run(request):
    proc, out = background.result(request, "decode")
    assert out.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def warn_failed_starts(proc, result: dict) -> None:
    """Each start that failed (bench_decode marks each): a warning of the
    run, with the logs before it, vLLM's (stdout) and Python's (stderr; a
    silent death prints its stack there: PYTHONFAULTHANDLER)."""
    errors = [e for e in result["engines"] if "error" in e]
    outs, errs = (s.split(bench_decode.START_FAILED) for s in (proc.stdout, proc.stderr))
    assert len(outs) == len(errs) == len(errors) + 1  # one mark a failed start
    for engine, out, err in zip(errors, outs, errs, strict=False):
        fault = err.find("Fatal Python error")  # the bench's traceback comes last
        warnings.warn(f"{engine['mode']} failed to start: {engine['error']}\n"
                      f"its processes: {engine.get('ended_children')}\n"
                      f"--- stdout ---\n{out[-2000:]}\n--- stderr ---\n"
                      f"{err[fault:fault + 3000] if fault >= 0 else ''}{err[-2000:]}",
                      stacklevel=2)


def test_engines_say_what_they_changed(decode_run):
    proc, result = decode_run
    warn_failed_starts(proc, result)
    # One start a mode: the job does not retry (--start-retries 0).
    engines = {e["mode"]: e for e in result["engines"]}
    assert len(result["engines"]) == len(MODES)
    assert list(engines) == MODES
    for mode in MODES:
        # A string, not a tuple: pytest prints a message whole, but cuts a
        # long repr (an engine that failed to start on CI, 2026-11-28, left
        # only its last line; its root cause is in the engine core's log).
        assert "error" not in engines[mode], (
            f"{mode}: {engines[mode]['error']}\n--- stderr ---\n{proc.stderr[-6000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # self_draft: the plugin's config and K, no draft model.
    self_draft = engines["self_draft"]["engine_args"]
    assert self_draft["additional_config"] == {
        "spec_extend": {**SPEC_EXTEND, "self_draft": True}}
    assert self_draft["speculative_config"] == {"num_speculative_tokens": K}

    plain, vllm_spec, plugin = (engines[m]["engine_args"] for m in MODES[:3])
    assert "speculative_config" not in plain and "additional_config" not in plain
    assert vllm_spec["speculative_config"]["num_speculative_tokens"] == K
    assert "rejection_sample_method" not in vllm_spec["speculative_config"]
    assert "additional_config" not in vllm_spec
    assert plugin["speculative_config"] == vllm_spec["speculative_config"]
    assert plugin["additional_config"] == {"spec_extend": SPEC_EXTEND}
    for mode in MODES:
        engine = engines[mode]
        assert engine["engine_args"]["disable_log_stats"] is False
        assert engine["engine_args"]["kv_cache_memory_bytes"] == 1_000_000_000
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in engine["vllm_env"]
        assert isinstance(engine["async_scheduling"], bool)
        assert engine["kv_cache_tokens"] > 0 and engine["startup_s"] > 0
        # The plugin's worker answers only in its modes.
        assert engine["plugin_active"] == (mode in ("spec_extend", "self_draft"))
    # What draft_prompt_pool became: SPEC_EXTEND's "auto" is 2 x top_k for the
    # draft model and the full pass for self_draft (no draft KV of its own).
    assert engines["spec_extend"]["draft_prompt_pool"] == 2 * SPEC_EXTEND["top_k"]
    assert engines["self_draft"]["draft_prompt_pool"] is None


def test_cells_have_runs_and_spreads(decode_run):
    _, result = decode_run
    assert result["meta"]["config"]["fresh_prompts"] is True  # the default
    rows = result["results"]
    assert sorted((r["mode"], r["context"], r["batch"]) for r in rows) == sorted(
        (m, c, b) for m in MODES for c in CONTEXTS for b in BATCHES)
    for row in rows:
        runs = row["runs"]
        assert len(runs) == RUNS
        tok = row["decode_tok_s"]
        assert tok["n"] == RUNS and tok["min"] <= tok["median"] <= tok["max"]
        assert row["e2e_tok_s"]["n"] == RUNS and row["ttft_s"]["n"] == RUNS
        assert row["fresh_prompts"] is True
        for run in runs:
            assert run["output_tokens"] == row["batch"] * OUTPUT_LEN
            assert run["decode_tokens"] == row["batch"] * (OUTPUT_LEN - 1)
            assert run["decode_tok_s"] > 0 and run["e2e_tok_s"] > 0
            assert 0 < run["decode_s"] <= run["e2e_s"]
            assert 0 < run["ttft_s_median"] <= run["ttft_s"] < run["e2e_s"]
            # Fresh prompts: nothing served from the prefix cache.
            assert run["num_cached_tokens"] == 0
            if row["mode"] == "plain":
                assert run["acceptance_length"] is None and "draft_steps" not in run
                assert "spec_extend" not in run
                continue
            assert 1.0 <= run["acceptance_length"] <= K + 1
            assert run["draft_steps"] > 0 and run["draft_step_ms_median"] > 0
            if row["mode"] in ("spec_extend", "self_draft"):
                stats = run["spec_extend"]
                assert stats["view_rows"] > 0 and stats["retrievals"] > 0
                assert stats["draft_context_tokens"] < stats["full_context_tokens"]
                assert run["scoring_share_of_decode"] >= 0
                assert run["prepare_view_cpu_ms_median"] > 0
            else:
                assert "spec_extend" not in run


def test_greedy_outputs_equal_across_modes(decode_run):
    _, result = decode_run
    digests: dict = {}
    for row in result["results"]:
        # Each run its own prompts, the same in every mode.
        for i, run in enumerate(row.get("runs", [])):
            digests.setdefault((row["context"], row["batch"], i), set()).add(
                run["output_sha256"])
    assert len(digests) == len(CONTEXTS) * len(BATCHES) * RUNS
    assert all(len(d) == 1 for d in digests.values()), digests


def test_eagle3_head_shorter_than_the_context(request):
    """The 256-position EAGLE-3 head on 1024-token prompts: vLLM alone never
    runs it; SpecExtend drafts through compacted views; both lossless."""
    proc, out = background.result(request, "eagle3")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    warn_failed_starts(proc, result)
    alone, extend = (r["runs"][0] for r in result["results"])

    assert [r["mode"] for r in result["results"]] == ["eagle3", "spec_extend"]
    assert all(r["method"] == "eagle3" for r in result["results"])
    assert all(e["env_set"]["VLLM_USE_V2_MODEL_RUNNER"] == "0"
               for e in result["engines"])
    assert alone["output_sha256"] == extend["output_sha256"]
    # Past the head's positions vLLM alone never runs it: its token-0
    # placeholders are verified and rejected.
    assert alone["draft_steps"] == 0 and alone["acceptance_length"] == 1.0
    assert extend["draft_steps"] > 0 and extend["spec_extend"]["view_rows"] > 0
    assert extend["spec_extend"]["compactions"] > 0


def test_the_plugin_modes_are_refused_without_the_plugin(monkeypatch, tmp_path, capsys):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    with pytest.raises(SystemExit):
        bench_decode.parse_args(["--target", "T", "--modes", "plain", "self_draft",
                                 "--out", str(tmp_path / "x.json")])
    assert "entry point is missing" in capsys.readouterr().err
    # vLLM's own modes need no plugin.
    args = bench_decode.parse_args(["--target", "T", "--modes", "plain",
                                    "--out", str(tmp_path / "x.json")])
    assert args.modes == ["plain"]
