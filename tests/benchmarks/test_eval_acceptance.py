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
