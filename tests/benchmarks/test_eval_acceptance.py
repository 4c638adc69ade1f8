"""Acceptance arithmetic of the long-input evaluation (benchmarks/longinput)."""

from __future__ import annotations

import pytest

from benchmarks.longinput import acceptance
from benchmarks.longinput.acceptance import (
    Step,
    counter_delta,
    replay,
    replay_agrees,
    summarize,
    token_status,
)


def test_summarize_counts_the_bonus_token_in_accepted_length():
    delta = {"drafts": 10, "draft_tokens": 40, "accepted_tokens": 25,
             "accepted_per_pos": [9, 8, 5, 3]}
    got = summarize(delta)
    assert got["mean_accepted_length"] == pytest.approx(3.5)
    assert got["accepted_per_draft"] == pytest.approx(2.5)
    assert got["acceptance_rate"] == pytest.approx(25 / 40)
    assert got["acceptance_per_pos"] == pytest.approx([0.9, 0.8, 0.5, 0.3])


def test_summarize_plain_decoding_and_empty_runs():
    assert summarize(None)["mean_accepted_length"] == 1.0
    assert summarize(None)["acceptance_rate"] is None
    with pytest.raises(ValueError, match="no drafts"):
        summarize({"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0,
                   "accepted_per_pos": [0, 0]})


def test_counter_delta_per_position():
    before = {"drafts": 3, "draft_tokens": 12, "accepted_tokens": 5,
              "accepted_per_pos": [3, 2, 0, 0]}
    after = {"drafts": 7, "draft_tokens": 28, "accepted_tokens": 11,
             "accepted_per_pos": [7, 4, 0, 0]}
    assert counter_delta(before, after) == {
        "drafts": 4, "draft_tokens": 16, "accepted_tokens": 6,
        "accepted_per_pos": [4, 2, 0, 0],
    }


OUTPUT = [10, 11, 12, 13, 14, 15, 16]


def test_replay_follows_greedy_verification():
    # Step 1 drafts output[1:5], keeps 2 (11, 12) + target token 13.
    # Step 2 starts at output[4], keeps 14, 15, 16 and runs past the end.
    steps = replay([[11, 12, 99, 98], [14, 15, 16, 17], [1, 2, 3, 4]], OUTPUT)
    assert steps == [Step(1, (11, 12, 99, 98), 2), Step(4, (14, 15, 16, 17), 3)]
    assert token_status(steps, len(OUTPUT)) == [
        "prefill", "accepted", "accepted", "rejected",
        "accepted", "accepted", "accepted",
    ]


def test_full_acceptance_leaves_a_bonus_token_without_a_guess():
    steps = replay([[11, 12, 13, 14], [16, 0, 0, 0]], OUTPUT)
    assert [s.accepted for s in steps] == [4, 1]
    status = token_status(steps, len(OUTPUT))
    assert status[5] == "bonus"
    assert status[6] == "accepted"


def test_tokens_after_the_last_proposal_are_unverified():
    steps = replay([[0, 0, 0, 0]], OUTPUT)
    assert token_status(steps, len(OUTPUT)) == [
        "prefill", "rejected", *["unverified"] * 5,
    ]


def test_replay_agrees_with_vllm_counters_up_to_truncation():
    steps = replay([[11, 12, 99, 98], [14, 15, 16, 17]], OUTPUT)
    # accepted 2 + 3; the last step reached the end and may have kept 17 too.
    assert replay_agrees(steps, len(OUTPUT), {"drafts": 2, "accepted_tokens": 5})
    assert replay_agrees(steps, len(OUTPUT), {"drafts": 2, "accepted_tokens": 6})
    assert not replay_agrees(steps, len(OUTPUT), {"drafts": 2, "accepted_tokens": 7})
    assert not replay_agrees(steps, len(OUTPUT), {"drafts": 2, "accepted_tokens": 4})
    assert not replay_agrees(steps, len(OUTPUT), {"drafts": 3, "accepted_tokens": 5})
    # A last step rejected inside the output leaves no room for more.
    steps = replay([[11, 12, 99, 98]], OUTPUT)
    assert not replay_agrees(steps, len(OUTPUT), {"drafts": 1, "accepted_tokens": 3})


def test_interval_brackets_the_pooled_accepted_length():
    # Prompts that accept 1, 2 and 3 tokens per draft: the pooled figure is 3.0.
    units = [{"drafts": 10, "accepted_tokens": 10 * a} for a in (1, 2, 3)] * 4
    lo, hi = acceptance.accepted_length_interval(units)
    assert 2.0 < lo < 3.0 < hi < 4.0
    # The same prompts every time: no spread.
    same = [{"drafts": 8, "accepted_tokens": 12}] * 5
    assert acceptance.accepted_length_interval(same) == [2.5, 2.5]


def test_interval_needs_two_batches_with_drafts():
    assert acceptance.accepted_length_interval([]) is None
    one = [{"drafts": 5, "accepted_tokens": 5}, {"drafts": 0, "accepted_tokens": 0}]
    assert acceptance.accepted_length_interval(one) is None


def test_interval_narrows_with_more_prompts():
    few = [{"drafts": 10, "accepted_tokens": 10 * a} for a in (1, 3)] * 2
    many = few * 25
    lo_few, hi_few = acceptance.accepted_length_interval(few)
    lo_many, hi_many = acceptance.accepted_length_interval(many)
    assert hi_many - lo_many < (hi_few - lo_few) / 3


def _units(pairs):
    return [{"accepted_tokens": a, "drafts": d} for a, d in pairs]


def _eval_row(mode, counters, config, dataset="govreport", working_set=512,
              hashes=("x", "y")):
    """A batch-1 eval row of 8K prompts as `paired` reads it: per-prompt
    (accepted, drafts) counters and their mean accepted length."""
    return {"task": "eval", "batch_size": 1, "dataset": dataset, "length": 8192,
            "mode": mode, "working_set": working_set, "prompt_hashes": list(hashes),
            "config": config,
            "mean_accepted_length": 1 + sum(a for a, _ in counters)
            / sum(d for _, d in counters),
            "batch_counters": _units(counters)}


def test_paired_ratio_draws_the_same_prompts_for_both_runs():
    base = _units([(20, 10), (30, 10), (10, 10)])
    # Every prompt accepted 2 more tokens in its 10 drafts: each draw's ratio
    # lies between the prompts' own (1.05 to 1.10), and all drafted better.
    better = _units([(a + 2, d) for a, d in [(20, 10), (30, 10), (10, 10)]])
    pair = acceptance.paired_ratio(better, base)
    assert pair["ratio"] == pytest.approx((1 + 66 / 30) / (1 + 60 / 30))
    assert pair["better"] == 3 and pair["prompts"] == 3
    low, high = pair["interval"]
    assert 1.05 - 1e-9 <= low <= pair["ratio"] <= high <= 1.1 + 1e-9
    # Identical runs: a ratio of 1 in every draw, and no prompt better.
    same = acceptance.paired_ratio(base, base)
    assert same["interval"] == [1.0, 1.0] and same["better"] == 0
    # Unpaired lists, or a single prompt: no answer.
    assert acceptance.paired_ratio(better[:2], base) is None
    assert acceptance.paired_ratio(better[:1], base[:1]) is None
    # A prompt one run never drafted for drops out of both (no inf, no nan).
    gap = _units([(0, 0), (30, 10), (10, 10)])
    pair = acceptance.paired_ratio(gap, base)
    assert pair["prompts"] == 2 and pair["ratio"] == pytest.approx(1.0)
    assert acceptance.paired_ratio(gap[:2], base[:2]) is None


def test_replay_verifies_only_the_drafts_that_fit_the_context():
    """Near max_model_len vLLM's scheduler verifies fewer drafts than the
    drafter proposed: a step at output position pos computes at most
    room - pos tokens. Seen on the GPU: 8168-token prompts, 24 new tokens, a
    context of 8192 positions (room 24): the step at 21 verified 2 drafts."""
    output = list(range(100, 124))
    proposals = [output[p:p + 4] for p in (1, 6, 11, 16, 21)]
    steps = replay(proposals, output, room=24)
    assert [len(s.proposal) for s in steps] == [4, 4, 4, 4, 2]
    assert sum(s.accepted for s in steps) == 18
    assert replay_agrees(steps, len(output), {"drafts": 5, "accepted_tokens": 18})
    # Without the room the replay counts a draft vLLM never verified.
    assert sum(s.accepted for s in replay(proposals, output)) == 19


def test_paired_report_matches_rows_on_the_same_prompts(tmp_path):
    import json

    from benchmarks.longinput import eval_longinput

    def row(mode, counters, hashes, recent=128):
        return _eval_row(mode, counters, {"recent_tokens": recent, "top_k": 11},
                         dataset="pg19", hashes=hashes)

    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps({"rows": [row("self_streaming", [(30, 10), (20, 10)], ["x", "y"]),
                                      row("self_cmr", [(20, 10), (20, 10)], ["x", "y"])]}))
    # Another prompt set: never paired with the baseline above.
    b.write_text(json.dumps({"rows": [row("self_cmr", [(40, 10), (40, 10)], ["x", "z"],
                                          recent=256)]}))
    # Another engine's rows (scoring layer 21), its own baseline beside them:
    # each CMR row pairs with its engine's baseline only.
    d = tmp_path / "d.json"
    other = [row("self_streaming", [(30, 10), (20, 10)], ["x", "y"]),
             row("self_cmr", [(30, 10), (30, 10)], ["x", "y"])]
    for r in other:
        r["config"]["score_layer"] = 21
    d.write_text(json.dumps({"rows": other}))
    # Another working set, and plain decoding: neither is paired with it.
    wider = row("self_cmr", [(40, 10), (40, 10)], ["x", "y"])
    wider["working_set"] = 1024
    plain = row("none", [(0, 10), (0, 10)], ["x", "y"])
    plain["working_set"] = None
    c = tmp_path / "c.json"
    c.write_text(json.dumps({"rows": [wider, plain]}))
    out = tmp_path / "paired.json"
    assert eval_longinput.main(["paired", str(a), str(b), str(c), str(d),
                                "--out", str(out)]) == 0
    only, layer21 = json.loads(out.read_text())["rows"]
    assert (layer21["score_layer"], layer21["ratio"]) == (21, pytest.approx(4.0 / 3.5))
    assert (only["mode"], only["recent_tokens"], only["better"]) == ("self_cmr", 128, 0)
    assert only["score_layer"] == -1  # a row from before the key: the final layer
    assert only["ratio"] == pytest.approx(3.0 / 3.5)
    assert "| pg19 | 8192 | self_cmr | 512 | 128 | 11 | -1 | 3.00 | 3.50 (512) |" in (
        out.with_suffix(".md").read_text())


def test_paired_report_lends_a_window_baseline_to_another_layers_engine(tmp_path):
    """A later call runs only CMR with another scoring layer: streaming's
    drafts rank nothing, so the first engine's streaming row is its baseline.
    A retrieving baseline never crosses layers."""
    import json

    from benchmarks.longinput import eval_longinput

    def row(mode, counters, layer=None):
        config = {"recent_tokens": 128, "top_k": 11}
        if layer is not None:
            config["score_layer"] = layer
        return _eval_row(mode, counters, config)

    first = tmp_path / "first.json"
    first.write_text(json.dumps({"rows": [row("self_streaming", [(30, 10), (20, 10)]),
                                          row("self_cmr", [(20, 10), (20, 10)])]}))
    later = tmp_path / "later.json"
    later.write_text(json.dumps({"rows": [row("self_cmr", [(40, 10), (30, 10)], 21)]}))
    out = tmp_path / "paired.json"
    assert eval_longinput.main(["paired", str(first), str(later), "--out", str(out)]) == 0
    final, layer21 = json.loads(out.read_text())["rows"]
    assert (final["score_layer"], final["ratio"]) == (-1, pytest.approx(3.0 / 3.5))
    assert (layer21["score_layer"], layer21["ratio"]) == (21, pytest.approx(4.5 / 3.5))
    # Against a CMR baseline the layer-21 row has no pair: its drafts differ
    # by the layer that ranks the chunks.
    assert eval_longinput.main(["paired", str(first), str(later), "--baseline", "self_cmr",
                                "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["self_streaming"]


def test_paired_report_one_baseline_per_row_and_only_within_one_drafter(tmp_path):
    """Two engines' streaming rows could both stand in for a third layer's
    CMR row: it pairs once, with the default layer's. Rows of another drafter
    on the same prompts (a distilled draft against the target drafting for
    itself) never pair; vLLM's full-KV draft_model pairs with its drafter's
    window."""
    import json

    from benchmarks.longinput import eval_longinput

    def row(mode, counters, layer=None, working_set=512):
        config = None if mode == "draft_model" else {"recent_tokens": 128, "top_k": 11}
        if layer is not None:
            config["score_layer"] = layer
        return _eval_row(mode, counters, config, working_set=working_set)

    def write(name, rows, draft="(self_draft only)"):
        path = tmp_path / name
        path.write_text(json.dumps({"meta": {"models": {"draft": {"path": draft}},
                                             "config": {"num_spec_tokens": 4}},
                                    "rows": rows}))
        return str(path)

    files = [write("a.json", [row("self_streaming", [(30, 10), (20, 10)], 5)]),
             write("b.json", [row("self_streaming", [(20, 10), (20, 10)])]),
             write("c.json", [row("self_cmr", [(40, 10), (30, 10)], 21)]),
             write("d.json", [row("streaming", [(6, 10), (6, 10)]),
                              row("draft_model", [(4, 10), (5, 10)], working_set=None)],
                   draft="/pair/draft")]
    out = tmp_path / "paired.json"
    assert eval_longinput.main(["paired", *files, "--out", str(out)]) == 0
    (only,) = json.loads(out.read_text())["rows"]
    assert (only["mode"], only["score_layer"]) == ("self_cmr", 21)
    assert (only["baseline_score_layer"], only["baseline_borrowed"]) == (-1, True)
    assert only["ratio"] == pytest.approx(4.5 / 3.0)
    assert "(512, from layer -1)" in out.with_suffix(".md").read_text()
    assert eval_longinput.main(["paired", *files, "--baseline", "streaming",
                                "--out", str(out)]) == 0
    (full,) = json.loads(out.read_text())["rows"]
    assert (full["mode"], full["ratio"]) == ("draft_model", pytest.approx(1.45 / 1.6))
    # vLLM's draft_model engine has no scoring layer: nothing is borrowed.
    assert full["baseline_borrowed"] is False
    assert ", from layer" not in out.with_suffix(".md").read_text()


def test_paired_report_a_repeated_run_counts_once_the_later_files(tmp_path):
    """A run repeated in a later file (a cell run again on another machine)
    pairs once, with the later file's counters, as `report` merges it."""
    import json

    from benchmarks.longinput import eval_longinput

    def row(mode, counters):
        return _eval_row(mode, counters, {"recent_tokens": 64, "top_k": 5}, working_set=256)

    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"rows": [row("streaming", [(20, 10), (20, 10)]),
                                            row("cmr_compact", [(10, 10), (10, 10)])]}))
    later = tmp_path / "later.json"
    later.write_text(json.dumps({"rows": [row("cmr_compact", [(30, 10), (30, 10)])]}))
    out = tmp_path / "paired.json"
    assert eval_longinput.main(["paired", str(earlier), str(later), "--baseline", "streaming",
                                "--out", str(out)]) == 0
    (only,) = json.loads(out.read_text())["rows"]
    assert only["ratio"] == pytest.approx(4.0 / 3.0)
    # A repeated baseline too: the later window run is the one paired with.
    again = tmp_path / "again.json"
    again.write_text(json.dumps({"rows": [row("streaming", [(10, 10), (10, 10)])]}))
    assert eval_longinput.main(["paired", str(earlier), str(later), str(again),
                                "--baseline", "streaming", "--out", str(out)]) == 0
    (only,) = json.loads(out.read_text())["rows"]
    assert only["ratio"] == pytest.approx(4.0 / 2.0)
