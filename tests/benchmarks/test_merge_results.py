"""benchmarks/merge_results.py joins one benchmark's per-call result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import merge_results

SERVE = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "serve"
         / "20261122T1548Z_h100_8b-1b" / "results.json")


def part(key, mode, date):
    return {"meta": {"date_utc": date, "command": f"run {mode}",
                     "config": {"modes": [mode]}},
            key: [{"mode": mode, "concurrency": 1}]}


def test_rows_modes_and_calls():
    merged = merge_results.merge([part("results", "plain", "2026-11-22T16:18"),
                                  part("results", "draft_model", "2026-11-22T16:09")])
    assert [r["mode"] for r in merged["results"]] == ["plain", "draft_model"]
    assert merged["meta"]["config"]["modes"] == ["plain", "draft_model"]
    assert merged["meta"]["date_utc"] == "2026-11-22T16:09"
    assert [c["command"] for c in merged["meta"]["calls"]] == ["run plain",
                                                               "run draft_model"]


def test_refuses_different_benchmarks():
    with pytest.raises(ValueError, match="same benchmark"):
        merge_results.merge([part("runs", "plain", "a"), part("results", "plain", "b")])


def test_serve_parts_get_summary(tmp_path):
    # Split a committed three-server result back into per-call files.
    result = json.loads(SERVE.read_text())
    files = []
    for mode in ("plain", "spec_extend"):
        meta = dict(result["meta"], config=dict(result["meta"]["config"], modes=[mode]))
        files.append(tmp_path / f"{mode}.json")
        files[-1].write_text(json.dumps(
            {"meta": meta, "runs": [r for r in result["runs"] if r["mode"] == mode]}))
    out = tmp_path / "merged" / "results.json"
    assert merge_results.main([str(out), *map(str, files)]) == 0
    summary = (out.parent / "summary.md").read_text()
    assert summary.count("| plain |") == 3 and summary.count("| spec_extend |") == 3
    assert "| draft_model |" not in summary
