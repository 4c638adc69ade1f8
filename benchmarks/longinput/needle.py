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
