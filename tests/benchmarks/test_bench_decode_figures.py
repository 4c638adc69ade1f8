"""bench_decode's prompts and per-run figures without an engine: fresh prompts
by default (no prefix of one served to another), ``--cached-prompt`` reusing
the warm-up's, and time to first token, decode and end-to-end tok/s from
``RequestOutput``-shaped objects."""

from __future__ import annotations

import json
import os
import subprocess
import time
from types import SimpleNamespace

import pytest

from benchmarks.decode import bench_decode

VOCAB, CONTEXT, BATCH, RUNS = 512, 64, 2, 3


@pytest.mark.parametrize("vocab", [VOCAB, 3 + (RUNS + 1) * BATCH])
def test_fresh_prompts_differ_per_run_and_from_the_warm_up(vocab):
    """Also where the vocabulary has just enough first tokens (random first
    tokens would repeat there)."""
    warm, runs = bench_decode.cell_prompts(vocab, 0, CONTEXT, BATCH, RUNS, fresh=True)
    assert len(runs) == RUNS
    prompts = [p for s in (warm, *runs) for p in s]
    assert len(prompts) == (RUNS + 1) * BATCH
    assert all(len(p) == CONTEXT and 3 <= min(p) and max(p) < vocab for p in prompts)
    # From the first token on: no prompt shares a prefix (a cached block) with
    # another, the warm-up's, another run's or another request's.
    assert len({p[0] for p in prompts}) == len(prompts)
    # The same prompts in every mode (each mode's engine asks again).
    again = bench_decode.cell_prompts(vocab, 0, CONTEXT, BATCH, RUNS, fresh=True)
    assert again == (warm, runs)


def test_cached_prompt_reuses_the_warm_ups():
    warm, runs = bench_decode.cell_prompts(VOCAB, 0, CONTEXT, BATCH, RUNS, fresh=False)
    assert runs == [warm] * RUNS
    assert len(warm) == BATCH and len({p[0] for p in warm}) == BATCH


def test_fresh_prompts_need_a_first_token_each():
    with pytest.raises(ValueError, match="--cached-prompt"):
        bench_decode.cell_prompts(8, 0, CONTEXT, BATCH, RUNS, fresh=True)


def test_fresh_by_default_cached_on_request():
    base = ["--target-config", "t", "--modes", "plain", "--out", "x.json"]
    assert bench_decode.parse_args(base).fresh_prompts is True
    assert bench_decode.parse_args([*base, "--fresh-prompts"]).fresh_prompts is True
    assert bench_decode.parse_args([*base, "--cached-prompt"]).fresh_prompts is False
    with pytest.raises(SystemExit):
        bench_decode.parse_args([*base, "--fresh-prompts", "--cached-prompt"])


def output(ttft: float, first: float, last: float, tokens: int, cached=0):
    """A RequestOutput as vLLM 0.26 fills it in with stats on."""
    metrics = SimpleNamespace(first_token_latency=ttft, first_token_ts=first,
                              last_token_ts=last)
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(range(tokens)))],
                           metrics=metrics, num_cached_tokens=cached)


def test_run_figures_time_the_first_token_and_the_whole_call():
    # One request: 2 s to its first token, 1023 more tokens in 7 s.
    run = bench_decode.run_figures([output(2.0, 100.0, 107.0, 1024)], e2e_s=9.1)
    assert run["ttft_s"] == run["ttft_s_median"] == 2.0
    assert run["decode_tok_s"] == pytest.approx(1023 / 7.0)
    assert run["e2e_tok_s"] == pytest.approx(1024 / 9.1)
    assert run["e2e_tok_s"] < run["decode_tok_s"]
    assert run["output_tokens"] == 1024 and run["num_cached_tokens"] == 0


def test_a_batchs_ttft_is_its_last_first_token():
    outputs = [output(1.0, 50.0, 60.0, 100, cached=4080),
               output(3.0, 52.0, 61.0, 100, cached=None),
               output(2.0, 51.0, 59.0, 100)]
    run = bench_decode.run_figures(outputs, e2e_s=12.0)
    assert run["ttft_s"] == 3.0 and run["ttft_s_median"] == 2.0
    assert run["num_cached_tokens"] == 4080
    # Decode window: the union of [first, last], 50..61.
    assert run["decode_s"] == pytest.approx(11.0) and run["decode_tokens"] == 297
    assert run["e2e_tok_s"] == pytest.approx(300 / 12.0)
    assert run["e2e_tok_s"] < run["decode_tok_s"]


def test_run_figures_need_vllms_metrics():
    bare = output(1.0, 0.0, 0.0, 4)
    with pytest.raises(RuntimeError, match="disable_log_stats"):
        bench_decode.run_figures([bare], e2e_s=1.0)


def test_an_engine_that_fails_to_start_starts_again(tmp_path, monkeypatch, capsys):
    """``--start-retries``: a start that failed (recorded with its error) runs
    again, marked in both logs; a failure after the start does not, and counts
    as failed; so does a start that fails every time."""
    out = tmp_path / "decode.json"
    calls, run = [], subprocess.run
    never_starts = set()

    def child(cmd, **kwargs):  # the ``--only`` process: what it adds to the file
        if "--only" not in cmd:
            return run(cmd, **kwargs)  # the metadata's (git)
        only = cmd[cmd.index("--only") + 1]
        calls.append(only)
        result = json.loads(out.read_text())
        mode = only.split(":")[0]
        if mode in never_starts or (mode == "plain" and calls.count(only) == 1):
            result["engines"].append({"mode": mode, "error": "RuntimeError: start"})
            code = 1
        else:
            result["engines"].append({"mode": mode})
            code = 1 if mode == "spec_extend" else 0  # fails while it runs
        out.write_text(json.dumps(result))
        return subprocess.CompletedProcess(cmd, code)

    monkeypatch.setattr(bench_decode.subprocess, "run", child)
    argv = ["--target-config", "t", "--draft-config", "d", "--modes", "plain",
            "draft_model", "spec_extend", "--out", str(out), "--start-retries", "2"]
    assert bench_decode.main(argv) == 1
    assert calls == ["plain:-1", "plain:-1", "draft_model:0", "spec_extend:0"]
    logs = capsys.readouterr()
    assert "engines that failed: spec_extend:0" in logs.err
    mark = f"{bench_decode.START_FAILED} (plain:-1, attempt 1 of 3)"
    assert logs.out.count(bench_decode.START_FAILED) == 1 and mark in logs.out
    assert logs.err.count(bench_decode.START_FAILED) == 1 and mark in logs.err
    assert [bool(e.get("error")) for e in json.loads(out.read_text())["engines"]] == [
        True, False, False, False]
    # A start that fails every time: three starts, then failed.
    calls.clear()
    never_starts.add("draft_model")
    assert bench_decode.main([*argv, "--modes", "draft_model"]) == 1
    assert calls == ["draft_model:0"] * 3
    assert "engines that failed: draft_model:0" in capsys.readouterr().err
    # Without retries a failed start is final.
    calls.clear()
    assert bench_decode.main([*argv[:-2], "--modes", "draft_model"]) == 1
    assert calls == ["draft_model:0"]
    with pytest.raises(SystemExit):
        bench_decode.parse_args([*argv[:-2], "--start-retries", "-1"])


def _sleep():
    import time

    time.sleep(60)


def test_ended_children_name_the_signal():
    """What a failed start records of the processes it spawned: an engine
    core killed during start-up shows the signal, also once joined (vLLM's
    shutdown joins its processes before the error reaches the bench, which
    drops them from multiprocessing's list: CI run 38, 2026-11-28)."""
    import multiprocessing
    import multiprocessing.process
    import signal

    child = multiprocessing.get_context("spawn").Process(target=_sleep,
                                                         name="EngineCore")
    child.start()
    os.kill(child.pid, signal.SIGTERM)
    want = f"EngineCore (pid {child.pid}): killed by SIGTERM"
    # The signal lands when the kernel delivers it: on a loaded CI host
    # later than the next line (seen 2026-12-06).
    deadline = time.monotonic() + 10
    while want not in bench_decode.ended_children() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert want in bench_decode.ended_children()
    child.join()
    assert child not in multiprocessing.process._children
    assert f"EngineCore (pid {child.pid}): killed by SIGTERM" in bench_decode.ended_children()
