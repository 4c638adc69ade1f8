"""benchmarks/longinput/plot_eval.py draws the PNGs a results file supports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")
from benchmarks.longinput import plot_eval  # noqa: E402  (after the skip)

PNG = b"\x89PNG\r\n\x1a\n"


def eval_row(dataset, length, mode, accepted, tok_s):
    return {"task": "eval", "dataset": dataset, "length": length, "mode": mode,
            "config": None, "mean_accepted_length": accepted, "decode_tok_s": tok_s,
            "prompt_hashes": ["p"], "output_hashes": ["o"]}


def needle_row(mode, depth, matched):
    return {"task": "needle", "dataset": "pg19", "length": 4096, "depth": depth,
            "mode": mode, "config": None, "target_correct": True, "matched": matched, "proposed": 4,
            "all_matched": matched == 4, "replay_consistent": True,
            "prompt_hashes": ["n"], "output_hashes": ["o"]}


def write(path: Path, rows) -> str:
    path.write_text(json.dumps({"meta": {}, "rows": rows}))
    return str(path)


def test_plots_from_merged_files(tmp_path):
    first = [eval_row(d, n, m, a, t) for d in ("govreport", "pg19")
             for n in (512, 2048) for m, a, t in (("none", 1.0, 100.0),
                                                  ("cmr", 2.4, 180.0))]
    second = [needle_row(m, d, k) for m, k in (("streaming", 1), ("cmr", 4))
              for d in (0.1, 0.9)]
    files = [write(tmp_path / "a.json", first), write(tmp_path / "b.json", second)]
    out = tmp_path / "plots"
    assert plot_eval.main([*files, "--out-dir", str(out)]) == 0
    for name in ("accepted_length.png", "decode_tok_s.png", "needle.png"):
        assert (out / name).read_bytes().startswith(PNG), name


def test_no_needle_plot_when_the_target_never_answered(tmp_path):
    rows = [eval_row("pg19", 512, "none", 1.0, 10.0)]
    rows.append({**needle_row("cmr", 0.5, 0), "target_correct": False,
                 "proposed": 0, "all_matched": None})
    out = tmp_path / "plots"
    path = write(tmp_path / "r.json", rows)
    assert plot_eval.main([path, "--out-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["accepted_length.png",
                                                     "decode_tok_s.png"]


def test_no_speed_plot_where_a_merged_run_shared_the_gpu(tmp_path):
    """host_run.sh's side_by_side (phases/common.sh) runs evaluations at
    once on one GPU: their tok/s are no speed results, so no
    decode_tok_s.png, even where only a file merged into another shared it."""
    alone = write(tmp_path / "alone.json", [eval_row("pg19", 512, "cmr", 2.0, 10.0)])
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps({
        "meta": {"config": {}, "merged": [{"config": {"shared_gpu": True}}]},
        "rows": [eval_row("pg19", 2048, "cmr", 2.0, 10.0)]}))
    out = tmp_path / "plots"
    assert plot_eval.main([alone, str(merged), "--out-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["accepted_length.png"]
    assert plot_eval.main([alone, "--out-dir", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "decode_tok_s.png").exists()


def test_needle_only_results_plot_only_the_needle(tmp_path):
    rows = [needle_row(m, d, 2) for m in ("draft_model", "cmr") for d in (0.1, 0.9)]
    out = tmp_path / "plots"
    assert plot_eval.main([write(tmp_path / "n.json", rows), "--out-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["needle.png"]


def test_one_line_per_mode_working_set_and_layer_with_intervals():
    def row(mode, length, accepted, working_set=None, layer=None, ci=None):
        config = None if mode == "none" else (
            {"score_layer": layer} if layer is not None else {})
        return {**eval_row("pg19", length, mode, accepted, 100.0), "config": config,
                "working_set": working_set, "accepted_length_ci95": ci}

    rows = [row("none", 4096, 1.0), row("self_cmr", 8192, 4.5, 1024, ci=[4.4, 4.7]),
            row("self_cmr", 4096, 4.6, 1024, ci=[4.5, 4.8]),
            row("self_cmr", 4096, 4.2, 256), row("self_cmr", 4096, 4.4, 256, layer=21),
            row("self_streaming", 4096, 4.1, 256, layer=21)]
    got = plot_eval.lines(rows, "mean_accepted_length")
    # Numeric working-set order; a layer only on retrieving rows, -1 unnamed.
    assert list(got) == ["none", "self_streaming 256", "self_cmr 256",
                         "self_cmr 256 layer 21", "self_cmr 1024"]
    assert [x for x, _, _ in got["self_cmr 1024"]] == [4096, 8192]
    assert got["self_cmr 1024"][0][2] == (pytest.approx(0.1), pytest.approx(0.2))
    assert got["self_cmr 256"][0][2] == (0.0, 0.0)
    # Speed has no interval.
    assert plot_eval.lines(rows, "decode_tok_s")["self_cmr 1024"][0][2] == (0.0, 0.0)
    # A layer-21 engine's streaming row at a length the default engine also
    # ran: one point, the default engine's.
    rows.append(row("self_streaming", 4096, 4.0, 256))
    assert [(x, y) for x, y, _ in
            plot_eval.lines(rows, "mean_accepted_length")["self_streaming 256"]] == [(4096, 4.0)]
