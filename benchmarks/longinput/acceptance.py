"""Acceptance arithmetic: vLLM's spec-decode counters and a greedy replay.

Conventions (the same as vLLM's ``SpecDecoding metrics:`` line):

* ``mean_accepted_length`` counts the bonus token: tokens emitted per target
  forward, ``1 + accepted / drafts``, in [1, K + 1]. Plain decoding has 1.
* ``accepted_per_draft`` does not: ``accepted / drafts``, in [0, K]. This is
  the SpecExtend reference code's tau.
* ``acceptance_rate``: accepted draft tokens / proposed draft tokens.

The replay rebuilds which output token each draft proposal covered, from the
proposals in order and the final greedy output, without vLLM internals.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(llm) -> dict:
    """vLLM's cumulative spec-decode counters (summed over label sets)."""
    values = {key: 0 for key in COUNTERS}
    per_pos: list[int] = []
    names = {name: key for key, name in COUNTERS.items()}
    for metric in llm.get_metrics():
        if metric.name in names:
            values[names[metric.name]] += metric.value
        elif metric.name == PER_POSITION:
            per_pos = [a + b for a, b in itertools.zip_longest(per_pos, metric.values,
                                                               fillvalue=0)]
    values["accepted_per_pos"] = per_pos
    return values


def counter_delta(before: dict, after: dict) -> dict:
    delta = {k: after[k] - before[k] for k in COUNTERS}
    delta["accepted_per_pos"] = [
        a - b for a, b in zip(after["accepted_per_pos"], before["accepted_per_pos"],
                             strict=True)
    ]
    return delta


def summarize(delta: dict | None) -> dict:
    """Acceptance figures of one run from its counter deltas (None: no drafts)."""
    if delta is None:  # plain decoding: one token per target forward
        return {"mean_accepted_length": 1.0, "accepted_per_draft": 0.0,
                "acceptance_rate": None, "acceptance_per_pos": None}
    drafts = delta["drafts"]
    if not drafts:
        raise ValueError("the run made no drafts: nothing to measure")
    return {
        "mean_accepted_length": 1.0 + delta["accepted_tokens"] / drafts,
        "accepted_per_draft": delta["accepted_tokens"] / drafts,
        "acceptance_rate": delta["accepted_tokens"] / delta["draft_tokens"],
        "acceptance_per_pos": [n / drafts for n in delta["accepted_per_pos"]],
    }


def accepted_length_interval(units: list[dict], level: float = 0.95,
                             resamples: int = 2000, seed: int = 0) -> list[float] | None:
    """A bootstrap interval of the mean accepted length over ``units`` (the
    counter deltas of each batch of a run; with batch size 1, of each prompt):
    units drawn with replacement, ``1 + accepted / drafts`` of their sums, the
    central ``level`` of those. None with fewer than two units."""
    import numpy as np

    units = [u for u in units if u["drafts"]]
    if len(units) < 2:
        return None
    drafts = np.array([u["drafts"] for u in units], dtype=np.float64)
    accepted = np.array([u["accepted_tokens"] for u in units], dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, len(units), (resamples, len(units)))
    lengths = 1.0 + accepted[picks].sum(axis=1) / drafts[picks].sum(axis=1)
    tail = 100 * (1 - level) / 2
    return [float(x) for x in np.percentile(lengths, [tail, 100 - tail])]


def paired_ratio(units: list[dict], base: list[dict], level: float = 0.95,
                 resamples: int = 2000, seed: int = 0) -> dict | None:
    """Accepted length of ``units`` over that of ``base``, the same prompts
    in the same order (batch size 1: one unit per prompt): the ratio of the
    two runs' ``1 + accepted / drafts``, a bootstrap interval that draws
    prompts (the same draw for both), and how many prompts drafted better.
    None with fewer than two prompts that both runs drafted for."""
    import numpy as np

    if len(units) != len(base):
        return None
    # A prompt that one run never drafted for (it ended at once) has no
    # accepted length in that run: the pair says nothing, drop it.
    kept = [(u, b) for u, b in zip(units, base, strict=True) if u["drafts"] and b["drafts"]]
    if len(kept) < 2:
        return None
    arrays = [np.array([[u["accepted_tokens"], u["drafts"]] for u in run],
                       dtype=np.float64) for run in zip(*kept, strict=True)]
    (acc, drafts), (base_acc, base_drafts) = (a.T for a in arrays)

    def length(a, d):
        return 1.0 + a.sum(axis=-1) / d.sum(axis=-1)

    picks = np.random.default_rng(seed).integers(0, len(kept), (resamples, len(kept)))
    ratios = (length(acc[picks], drafts[picks])
              / length(base_acc[picks], base_drafts[picks]))
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(ratios, [tail, 100 - tail])
    better = int((acc / drafts > base_acc / base_drafts).sum())
    return {"ratio": float(length(acc, drafts) / length(base_acc, base_drafts)),
            "interval": [float(low), float(high)], "better": better,
            "prompts": len(kept)}


@dataclass(frozen=True)
class Step:
    """One verification: ``proposal`` drafted output[start:], ``accepted`` kept."""

    start: int
    proposal: tuple[int, ...]
    accepted: int


def replay(proposals: list[list[int]], output: list[int],
           room: int | None = None) -> list[Step]:
    """Greedy verification of ``proposals`` (in order) against ``output``.

    Output token 0 comes from the prefill; each step then keeps the longest
    prefix of its proposal that matches the output plus one target token.
    Proposals past the end of the output (the request finished) are dropped.
    ``room``: the tokens the context had left after the prompt (max_model_len
    - prompt length). Near that end vLLM's scheduler verifies only the drafts
    that fit (a step at output position ``pos`` computes at most ``room -
    pos`` tokens, the bonus one included); the drafter proposed them all.
    """
    steps, pos = [], 1
    for proposal in proposals:
        if pos >= len(output):
            break
        if room is not None:
            proposal = proposal[:max(room - pos - 1, 0)]
        accepted = 0
        for token, expected in zip(proposal, output[pos:], strict=False):
            if token != expected:
                break
            accepted += 1
        steps.append(Step(pos, tuple(proposal), accepted))
        pos += accepted + 1
    return steps


def token_status(steps: list[Step], num_output: int) -> list[str]:
    """Per output token: ``prefill`` (token 0), ``accepted`` (the draft proposed
    it), ``rejected`` (the draft proposed another token there) or ``bonus``
    (after a fully accepted proposal: the draft made no guess), ``unverified``
    past the last step."""
    status = ["unverified"] * num_output
    if num_output:
        status[0] = "prefill"
    for step in steps:
        for j in range(step.accepted):
            if step.start + j < num_output:
                status[step.start + j] = "accepted"
        last = step.start + step.accepted
        if last < num_output:
            full = step.accepted == len(step.proposal)
            status[last] = "bonus" if full else "rejected"
    return status


def replay_agrees(steps: list[Step], num_output: int, counters: dict) -> bool:
    """Whether the replay saw what vLLM verified: as many steps, and as many
    accepted tokens, except that the last step may have accepted drafts past
    the output's end (vLLM counts them, then truncates to max_tokens)."""
    if len(steps) != counters["drafts"]:
        return False
    accepted = sum(s.accepted for s in steps)
    slack = 0
    if steps:
        last = steps[-1]
        if last.start + last.accepted >= num_output:
            slack = len(last.proposal) - last.accepted
    return accepted <= counters["accepted_tokens"] <= accepted + slack
