"""Passkey retrieval: does the draft reproduce a passkey hidden in long text?

A 5-digit pass key sits at a given depth of a PG-19 haystack, and the prompt
ends with the question. The target answers (greedy); the draft is scored on the
output tokens that spell the key: a token counts as reproduced when the draft
proposed it given the correct prefix (``acceptance.token_status``).

The draft's first proposal comes out of its own prefill, over the full prompt
in every mode, so tokens it covers are not scored. The question lets the
target answer with a sentence ("The pass key is 60494."), which puts the key's
digits past that first proposal.
"""

from __future__ import annotations

import random

from benchmarks.longinput import acceptance, report

INTRO = (
    "There is an important piece of information hidden inside a lot of "
    "irrelevant text. Find it and memorize it. I will quiz you about it.\n\n"
)
NEEDLE = "\nThe pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "\n\nWhat is the pass key?\n\nAnswer:"


def pass_key(seed: int, index: int) -> str:
    return str(random.Random(seed * 1_000_003 + index).randint(10_000, 99_999))


def needle_prompt(encode, haystack: list[int], key: str, depth: float,
                  length: int) -> list[int]:
    """Exactly ``length`` tokens: intro, haystack with the needle at ``depth``
    (a fraction of the haystack), question. ``encode``: text -> token ids."""
    intro, question = encode(INTRO), encode(QUESTION)
    needle = encode(NEEDLE.format(key=key))
    size = length - len(intro) - len(needle) - len(question)
    if size <= 0 or len(haystack) < size:
        raise ValueError(f"cannot fit a {length}-token passkey prompt")
    at = round(depth * size)
    return intro + haystack[:at] + needle + haystack[at:size] + question


def key_tokens(decode, output: list[int], key: str) -> range | None:
    """Indices of the output tokens that spell the first ``key`` in the
    decoded output, or None if the output does not contain it."""
    ends = [len(decode(output[: i + 1])) for i in range(len(output))]
    at = decode(output).find(key)
    if at < 0:
        return None
    first = next(i for i, end in enumerate(ends) if end > at)
    last = next(i for i, end in enumerate(ends) if end >= at + len(key))
    return range(first, last + 1)


def skip_first_step(status: list[str], steps) -> list[str]:
    """``status`` with the tokens the first verification decided marked
    ``first_step``: the draft proposed them with full KV whatever the mode."""
    if not steps:
        return status
    end = steps[0].start + steps[0].accepted + 1
    return ["first_step"] * min(end, len(status)) + status[end:]


def score(status: list[str], span: range | None) -> dict:
    """Draft scores on the key's tokens. ``proposed``: tokens the draft guessed
    (accepted or rejected; prefill and bonus tokens had no guess).
    ``all_matched`` is None when the target missed the key or the draft
    guessed none of its tokens."""
    if span is None:
        return {"target_correct": False, "proposed": 0, "matched": 0,
                "all_matched": None}
    marks = [status[i] for i in span]
    matched = marks.count("accepted")
    proposed = matched + marks.count("rejected")
    return {
        "target_correct": True,
        "proposed": proposed,
        "matched": matched,
        "all_matched": matched == proposed if proposed else None,
    }


def case_key(row: dict) -> tuple:
    """A passkey case across runs: depth, key and the engine's scoring layer
    (a haystack's key is drawn from its seed, so it names the haystack; a
    run without ``--score-layers`` ran the engine's default, -1)."""
    return row["depth"], row["key"], report.engine_score_layer(row)


def paired(base: list[dict], other: list[dict]) -> list[dict]:
    """Two runs of the same passkey cases (``eval_longinput run --tasks
    needle``, e.g. one SpecExtend config against another), case by case, per
    scoring layer: for every case both ran and for those the target
    answered, the ratio of accepted lengths over the cases' vLLM counters
    (``acceptance.paired_ratio``: a 95% bootstrap interval drawing cases for
    both), the keys each reproduced and how many greedy outputs are equal.
    A case screened out (``--needle-screen``) in one run must be in the
    other: the same target answers alike."""
    a = {case_key(r): r for r in base if r["task"] == "needle"}
    b = {case_key(r): r for r in other if r["task"] == "needle"}
    if set(a) != set(b):
        raise ValueError(f"the runs hold other cases: {len(set(a) ^ set(b))} "
                         "in one only; pair runs of the same --needle-* flags")
    ran = [k for k in a if not a[k].get("screened")]
    if any(bool(b[k].get("screened")) != (k not in ran) for k in a):
        raise ValueError("a case screened out in one run only: were both "
                         "runs' targets the same?")

    def keys_reproduced(rows: dict, keys: list) -> int:
        return sum(bool(rows[k].get("all_matched")) for k in keys
                   if rows[k]["target_correct"])

    out = []
    for layer in sorted({k[2] for k in ran}, key=lambda x: -1 if x is None else x):
        mine = [k for k in ran if k[2] == layer]
        for cases, keys in (("run", mine),
                            ("answered", [k for k in mine if a[k]["target_correct"]])):
            if not keys:
                continue
            out.append({"score_layer": layer, "cases": cases, "n": len(keys),
                        "equal_outputs": sum(a[k]["output_hashes"] == b[k]["output_hashes"]
                                             for k in keys),
                        "keys_base": keys_reproduced(a, keys),
                        "keys_other": keys_reproduced(b, keys),
                        # Each case's vLLM counters, as the ratio reads them.
                        **(acceptance.paired_ratio([b[k]["spec_decode"] for k in keys],
                                                   [a[k]["spec_decode"] for k in keys])
                           or {})})
    return out
