"""benchmarks.decode.summarize_decode and plot_decode on bench_decode result files
(older files: one run per row; newer: runs per cell, engines, skipped cells)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.decode import summarize_decode


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
    from benchmarks.decode import plot_decode

    files = []
    for i, scale in enumerate((1.0, 0.8)):
        files.append(tmp_path / f"x_run{i}.json")
        files[-1].write_text(json.dumps(result(tp=2, timed=False, scale=scale)))
    out = tmp_path / "decode.png"
    plot_decode.plot(files, out)
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_names_the_host_where_files_differ():
    from benchmarks.decode import plot_decode

    files = [Path("a_32k.json"), Path("b_124k.json")]
    same, two = ["H200 ×4", "H200 ×4"], ["H200 ×4", "H100 ×4"]
    assert plot_decode.file_tags(files, same) == ["32k", "124k"]
    assert plot_decode.file_tags(files, two) == two


def new_result() -> dict:
    def cell(mode, context, batch, tok_s, **extra):
        runs = [{"decode_tok_s": t, "draft_step_ms_median": 2.0, "draft_steps": 9,
                 **extra} for t in tok_s]
        return {"mode": mode, "draft": None if mode == "plain" else "d",
                "context": context, "batch": batch, "runs": runs,
                "decode_tok_s": {"min": min(tok_s), "median": sorted(tok_s)[1],
                                 "max": max(tok_s), "n": 3}}

    plugin = {"spec_extend": {"draft_context_tokens": 20, "full_context_tokens": 100},
              "scoring_share_of_decode": 0.01}
    rows = [cell("plain", 32768, 1, [100, 90, 110]),
            cell("draft_model", 32768, 1, [150, 140, 160]),
            cell("spec_extend", 32768, 1, [200, 180, 210], **plugin),
            {"mode": "spec_extend", "draft": "d", "context": 65536, "batch": 8,
             "skipped": "does not fit"}]
    config = {"method": "draft_model", "acceptance_length": 3.0, "num_spec_tokens": 4,
              "output_len": 256, "runs": 3, "target_config": "t", "draft_config": ["d"]}
    meta = {"hardware": {"device": "GPU"}, "vllm": "0.26.0", "torch": "2.11",
            "date_utc": "d", "config": config}
    engines = [{"mode": "self_draft", "error": "RuntimeError: not yet"}]
    return {"meta": meta, "engines": engines, "results": rows}


def test_runs_per_cell_skipped_cells_and_failed_engines():
    text = summarize_decode.table(new_result())
    assert ("| d | 32K | 1 | 100 (90–110) | 150 (140–160) | 200 (180–210) "
            "| 2.00 → 2.00 | 20.0% | 1.0% |") in text
    assert "| d | 64K | 8 | – | – | skipped |" in text
    assert "3 runs per cell" in text
    assert "self_draft engine failed: RuntimeError: not yet" in text


def test_decode_and_end_to_end_side_by_side():
    result = new_result()
    for r, e2e in zip(result["results"], (80, 110, 150), strict=False):
        r["e2e_tok_s"] = {"min": e2e - 5, "median": e2e, "max": e2e + 5, "n": 3}
    result["meta"]["config"]["fresh_prompts"] = True
    text = summarize_decode.table(result)
    assert ("| d | 32K | 1 | 100 (90–110) / e2e 80 (75–85) | 150 (140–160) / e2e "
            "110 (105–115) | 200 (180–210) / e2e 150 (145–155) |") in text
    assert "fresh prompts in every run (each pays its prefill)" in text
    result["meta"]["config"]["fresh_prompts"] = False
    assert "reuses the warm-up's prompts" in summarize_decode.table(result)


def test_plot_takes_medians_and_skips_cells(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks.decode import plot_decode

    path = tmp_path / "new.json"
    path.write_text(json.dumps(new_result()))
    out = tmp_path / "decode.png"
    plot_decode.plot([path], out)
    assert out.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
