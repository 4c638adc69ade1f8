"""``benchmarks.realpair.per_prompt``: a probe's accepted length per prompt."""

from __future__ import annotations

import json

import pytest

from benchmarks.realpair.per_prompt import acceptance, table


def _file(path, mode, specs, outputs):
    records = [{"id": f"p{i}", "batch": 1, "spec": spec, "output_ids": out}
               for i, (spec, out) in enumerate(zip(specs, outputs, strict=True))]
    path.write_text(json.dumps({"mode": mode, "records": records}))
    return path


def test_each_prompt_all_of_them_and_the_ratio_to_the_first(tmp_path):
    def spec(drafts, accepted):
        return {"drafts": drafts, "accepted_tokens": accepted}

    ref = _file(tmp_path / "a.json", "full", [spec(10, 30), spec(10, 10)],
                [[1, 2, 3], [4, 5]])
    other = _file(tmp_path / "b.json", "pool", [spec(10, 20), spec(0, 0)],
                  [[1, 2, 3], [4, 6]])
    plain = _file(tmp_path / "plain.json", "plain", [spec(0, 0)] * 2,
                  [[1, 2, 3], [4, 5]])
    lines = table([ref, other], plain).splitlines()
    assert lines[2] == "| full | a.json | 4.000 | 2.000 | 3.000 | 1.00 | 2/2 |"
    # 1 + 20 / 10 over both; the second prompt drafted nothing (1.0).
    assert lines[3] == ("| pool | b.json | 3.000 | 1.000 | 3.000 | 1.00 "
                        "| 1/2 (p1 at 1) |")
    assert acceptance([]) == 1.0


def test_files_of_other_prompts_are_refused(tmp_path):
    ref = _file(tmp_path / "a.json", "full", [{"drafts": 1, "accepted_tokens": 1}],
                [[1]])
    other = tmp_path / "b.json"
    other.write_text(json.dumps({"mode": "x", "records": []}))
    with pytest.raises(SystemExit, match="no record of p0"):
        table([ref, other])


def test_batch_records_and_other_cells_are_left_out(tmp_path):
    """A grid's file holds each prompt at batch 1 and in a batch of 8 (whose
    counts are the call's): the batch-1 record is the prompt's; --cell keeps
    one group and context."""
    def record(i, group, batch, drafts, accepted):
        return {"id": f"{group}-{i}", "group": group, "context": 16384, "batch": batch,
                "spec": {"drafts": drafts, "accepted_tokens": accepted},
                "output_ids": [i]}

    path = tmp_path / "grid.json"
    path.write_text(json.dumps({"mode": "m", "records": [
        record(0, "copy", 1, 10, 30), record(0, "other", 1, 10, 10),
        record(0, "copy", 8, 100, 100)]}))
    lines = table([path]).splitlines()
    assert lines[0] == "| mode | file | copy-0 | other-0 | all | × first |"
    assert lines[2] == "| m | grid.json | 4.000 | 2.000 | 3.000 | 1.00 |"
    assert table([path], cell="copy:16384").splitlines()[2] == (
        "| m | grid.json | 4.000 | 4.000 | 1.00 |")
    with pytest.raises(SystemExit, match="no batch-1 record of copy:8192"):
        table([path], cell="copy:8192")
