"""Passkey prompts and scoring of the long-input evaluation (benchmarks/longinput)."""

from __future__ import annotations

import json

import pytest

from benchmarks.longinput import needle
from benchmarks.longinput.acceptance import replay, token_status


def char_encode(text: str) -> list[int]:
    return [ord(c) for c in text]


HAYSTACK = list(range(100_000, 101_000))  # never collides with char codes


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_needle_prompt_has_exact_length_and_needle_at_depth(depth):
    prompt = needle.needle_prompt(char_encode, HAYSTACK, "12345", depth, 600)
    intro = char_encode(needle.INTRO)
    text = char_encode(needle.NEEDLE.format(key="12345"))
    question = char_encode(needle.QUESTION)
    size = 600 - len(intro) - len(text) - len(question)

    assert len(prompt) == 600
    assert prompt[:len(intro)] == intro
    assert prompt[-len(question):] == question
    at = len(intro) + round(depth * size)
    assert prompt[at:at + len(text)] == text
    # The haystack is kept in order around the needle, none of it repeated.
    hay = [t for t in prompt if t >= 100_000]
    assert hay == HAYSTACK[:size]


def test_needle_prompt_rejects_lengths_that_do_not_fit():
    with pytest.raises(ValueError, match="cannot fit"):
        needle.needle_prompt(char_encode, HAYSTACK, "12345", 0.5, 80)
    with pytest.raises(ValueError, match="cannot fit"):
        needle.needle_prompt(char_encode, HAYSTACK[:10], "12345", 0.5, 600)


def test_pass_keys_are_deterministic_five_digit_numbers():
    keys = [needle.pass_key(0, i) for i in range(20)]
    assert keys == [needle.pass_key(0, i) for i in range(20)]
    assert all(len(k) == 5 and k.isdigit() for k in keys)
    assert len(set(keys)) > 15
    assert needle.pass_key(1, 0) != needle.pass_key(0, 0)


PIECES = {1: " The", 2: " pass", 3: " key", 4: " is", 5: " 4", 6: "82", 7: "13",
          8: ".", 9: " 9"}


def piece_decode(ids) -> str:
    return "".join(PIECES[i] for i in ids)


def test_key_tokens_cover_exactly_the_key():
    output = [5, 6, 7, 8, 1]
    assert needle.key_tokens(piece_decode, output, "48213") == range(0, 3)
    output = [1, 2, 3, 4, 5, 6, 7, 8]
    assert needle.key_tokens(piece_decode, output, "48213") == range(4, 7)
    assert needle.key_tokens(piece_decode, [1, 9, 6, 7], "48213") is None


def test_key_tokens_with_a_real_tokenizer(tiny_tokenizer):
    key = "48213"
    text = " The pass key is 48213. Remember"
    output = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    span = needle.key_tokens(tiny_tokenizer.decode, output, key)
    assert span is not None
    assert key in tiny_tokenizer.decode([output[i] for i in span])
    # Minimal: dropping the span's first or last token loses part of the key.
    assert key not in tiny_tokenizer.decode([output[i] for i in span[1:]])
    assert key not in tiny_tokenizer.decode([output[i] for i in span[:-1]])


def test_score_counts_only_tokens_the_draft_guessed():
    status = ["prefill", "accepted", "accepted", "rejected", "bonus", "accepted"]
    assert needle.score(status, range(1, 6)) == {
        "target_correct": True, "proposed": 4, "matched": 3, "all_matched": False,
    }
    assert needle.score(status, range(4, 6))["all_matched"] is True
    assert needle.score(status, range(0, 1))["all_matched"] is None  # no guess
    assert needle.score(status, None) == {
        "target_correct": False, "proposed": 0, "matched": 0, "all_matched": None,
    }


def test_first_step_tokens_are_not_scored():
    output = [10, 11, 12, 13, 14, 15, 16]
    steps = replay([[11, 12, 99, 98], [14, 15, 16, 17]], output)
    status = needle.skip_first_step(token_status(steps, len(output)), steps)
    # The first verification decided tokens 0..3 (prefill, 2 accepted, 1 rejected).
    assert status == ["first_step"] * 4 + ["accepted"] * 3
    assert needle.score(status, range(2, 6)) == {
        "target_correct": True, "proposed": 2, "matched": 2, "all_matched": True,
    }
    assert needle.score(status, range(0, 3))["all_matched"] is None
    assert needle.skip_first_step(["prefill"], []) == ["prefill"]


def _case(depth, key, layer, *, accepted, drafts, correct=True, matched=True,
          output="h", screened=False):
    """A needle row as eval_longinput writes it (the fields pairing reads)."""
    row = {"task": "needle", "depth": depth, "key": key,
           "config": {"score_layer": layer}, "target_correct": correct,
           "all_matched": matched if correct else None}
    if screened:
        return {**row, "screened": True, "target_correct": False, "all_matched": None}
    return {**row, "output_hashes": [output],
            "spec_decode": {"drafts": drafts, "draft_tokens": 4 * drafts,
                            "accepted_tokens": accepted}}


def test_paired_needle_runs_case_by_case():
    """Two runs of the same cases: the ratio is of the runs' accepted lengths
    over the cases both ran (a screened case counts in neither), per scoring
    layer and again over the cases the target answered; keys and equal
    outputs are counted per side."""
    base = [_case(0.1, "11111", -1, accepted=20, drafts=10),
            _case(0.3, "22222", -1, accepted=30, drafts=10, correct=False),
            _case(0.5, "33333", -1, accepted=10, drafts=10),
            _case(0.7, "44444", -1, accepted=0, drafts=0, screened=True)]
    other = [_case(0.1, "11111", -1, accepted=10, drafts=10, matched=False),
             _case(0.3, "22222", -1, accepted=30, drafts=10, correct=False),
             _case(0.5, "33333", -1, accepted=10, drafts=10, output="x"),
             _case(0.7, "44444", -1, accepted=0, drafts=0, screened=True)]

    run, answered = needle.paired(base, list(reversed(other)))

    assert (run["cases"], run["n"], answered["cases"], answered["n"]) == ("run", 3, "answered", 2)
    # (1 + 50/30) / (1 + 60/30) over every case run; (1 + 20/20) / (1 + 30/20) answered.
    assert run["ratio"] == pytest.approx((1 + 50 / 30) / 3.0)
    assert answered["ratio"] == pytest.approx(2.0 / 2.5)
    assert run["interval"][0] <= run["ratio"] <= run["interval"][1]
    assert (answered["keys_base"], answered["keys_other"]) == (2, 1)
    assert (run["equal_outputs"], answered["equal_outputs"]) == (2, 1)


def test_paired_needle_pairs_the_default_layer_with_its_name():
    """A run without --score-layers (no score_layer in its rows' config) ran
    the engine's default, the final layer: its cases are those of -1."""
    cases = ((0.1, "1"), (0.5, "5"))
    base = [_case(d, k, -1, accepted=20, drafts=10) for d, k in cases]
    other = [_case(d, k, -1, accepted=10, drafts=10) for d, k in cases]
    for row in other:
        del row["config"]["score_layer"]
    run, _ = needle.paired(base, other)
    # (1 + 10/10) / (1 + 20/10) over both cases.
    assert run["score_layer"] == -1 and run["ratio"] == pytest.approx(2.0 / 3.0)


def test_paired_needle_refuses_other_cases():
    one = [_case(0.1, "11111", -1, accepted=1, drafts=1),
           _case(0.3, "22222", -1, accepted=1, drafts=1)]
    with pytest.raises(ValueError, match="other cases"):
        needle.paired(one, one[:1])
    screened = [one[0], _case(0.3, "22222", -1, accepted=0, drafts=0, screened=True)]
    with pytest.raises(ValueError, match="screened out in one run only"):
        needle.paired(one, screened)


def test_paired_needle_command_prints_the_table(tmp_path, capsys):
    from benchmarks.longinput import eval_longinput

    base = [_case(0.1, "11111", 21, accepted=20, drafts=10),
            _case(0.5, "33333", 21, accepted=10, drafts=10)]
    other = [_case(0.1, "11111", 21, accepted=10, drafts=10),
             _case(0.5, "33333", 21, accepted=10, drafts=10)]
    paths = []
    for name, rows in (("base", base), ("other", other)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"meta": {}, "rows": rows}))

    assert eval_longinput.main(["paired-needle", *map(str, paths)]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 21 ")]
    # 2 cases: (1 + 20/20) / (1 + 30/20) = 0.8; keys 2 → 2; outputs equal.
    assert table == ["| 21 | run | 2 | 0.800 | 0.667–1.000 | 0 | 2 → 2 | 2 of 2 |",
                     "| 21 | answered | 2 | 0.800 | 0.667–1.000 | 0 | 2 → 2 | 2 of 2 |"]
