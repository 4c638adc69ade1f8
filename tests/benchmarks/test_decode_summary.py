"""benchmarks/summarize_decode.py and plot_decode.py on bench_decode result files."""

from __future__ import annotations

import json

import pytest

from benchmarks import summarize_decode


def row(mode, context, batch, tok_s, timed):
    r = {"mode": mode, "draft": None if mode == "plain" else "d", "context": context,
         "batch": batch, "decode_tok_s": tok_s, "draft_timed": timed,
         "draft_step_ms_median": 2.5 if timed and mode != "plain" else None}
    if mode == "spec_extend":
        r["spec_extend"] = {"draft_context_tokens": 10, "full_context_tokens": 100}
        r["scoring_share_of_decode"] = 0.02
    return r


def result(tp, timed, scale=1.0):
    speeds = (("plain", 100.0), ("draft_model", 120.0), ("spec_extend", 150.0))
    rows = [row(m, c, b, scale * t, timed) for c in (16384, 32768) for b in (1, 8)
            for m, t in speeds]
    return {"meta": {"gpu": "GPU", "vllm": "0.26.0", "torch": "2.11.0", "date_utc": "d",
                     "config": {"method": "draft_model", "tensor_parallel_size": tp,
                                "acceptance_length": 3.0, "num_spec_tokens": 4,
                                "output_len": 128, "target_config": "t",
                                "draft_config": ["d"]}},
            "results": rows}


def test_worker_process_rows_say_not_timed():
    text = summarize_decode.table(result(tp=2, timed=False))
    assert ("| d | 16K | 8 | 100 | 120 | 150 | not timed → not timed "
            "| 10.0% | 2.0% |") in text
    assert "GPU ×2 (TP=2)" in text


def test_local_rows_show_step_times():
    text = summarize_decode.table(result(tp=1, timed=True))
    assert "| 2.50 → 2.50 |" in text and "TP=" not in text


def test_plot_overlays_runs(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import plot_decode

    files = []
    for i, scale in enumerate((1.0, 0.8)):
        files.append(tmp_path / f"x_run{i}.json")
        files[-1].write_text(json.dumps(result(tp=2, timed=False, scale=scale)))
    out = tmp_path / "decode.png"
    plot_decode.plot(files, out)
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
