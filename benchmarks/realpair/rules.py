"""Drafting rules scored offline: the draft's forecast and the lookup over
plain decoding's real answers (CPU).

Why: a rule that chooses, position by position, between the draft model's
token and the lookup's decides how many tokens a step accepts, and that
depends only on tokens: the answer (plain decoding's greedy output, which
every lossless mode reproduces), the lookup's proposals
(``drafting/lookup.py``, run here on the CPU) and the draft's own greedy
token after the answer's true prefix (``forecast.py``, one teacher-forced
forward a prompt). While a step's proposals are right the draft
sees that true prefix, and its first miss ends the step, so the score is
exact for a draft that reads the whole context (the plugin's reads its view:
the grid measures that). Rules, for K proposals a step:

- ``draft``: the draft all K (vLLM's ``draft_model``);
- ``then:r``: the draft r, the lookup the K - r after them, from one match
  keyed on ``[..., bonus, d_1..d_r]`` (the plugin's ``lookup_tokens``);
- ``led:r:T``: as ``then:r``, but at each of the first r positions the
  lookup's next token where its match is at least T tokens long, else the
  draft's;
- ``lookup``: the lookup all K from the bonus token (no draft);
- ``ngram``: vLLM's prompt lookup at its defaults (``ngram_proposer``: the
  last 5 tokens' earliest earlier match, up to K tokens after it);
- ``adapt:lo:hi``: as ``then:lo``, but a step drafts hi where the step two
  before it (what the host knows under async scheduling) held all its
  drafts and none of its looked-up tokens: the lookup misses, the draft
  holds.

``acc_len`` is tokens a step: an answer's tokens after its first over the
steps that made them (what vLLM's accepted length reads where every step
drafts and no draft is counted past the answer's end). Beside it,
``est_ms_per_token`` prices a step at
``--step-ms`` plus ``--draft-ms`` per drafted token (defaults: the H100
profile at 16K, 2026-12-06: a 9.2 ms step of which three draft forwards
3.5 ms): a rule's cost in draft forwards, not a measurement.

    python -m benchmarks.realpair.rules --cases CASES --outputs PLAIN.json \\
        --forecast FORECAST.json --k 12 --rules draft then:3 led:3:8 --out FILE.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness.meta import run_metadata
from benchmarks.realpair import answers
from vllm_specextend.drafting import lookup

VLLM_NGRAM = 5
"""vLLM's ``prompt_lookup_min`` and ``_max`` where neither is set."""


def parse_rule(text: str, k: int) -> tuple[str, int, int]:
    """``draft`` | ``then:r`` | ``led:r:T`` | ``adapt:lo:hi`` | ``lookup`` |
    ``ngram`` -> (kind, r, x): r the drafted count (lo for ``adapt``), x the
    lead's T or ``adapt``'s hi (0 for the others)."""
    kind, *nums = text.split(":")
    shapes = {"draft": 0, "lookup": 0, "ngram": 0, "then": 1, "led": 2, "adapt": 2}
    if kind not in shapes or len(nums) != shapes[kind] \
            or not all(n.isdigit() for n in nums):
        raise ValueError(f"rule {text!r}: draft, then:r, led:r:T, adapt:lo:hi, "
                         "lookup or ngram")
    r = {"draft": k, "lookup": 0, "ngram": 0}.get(kind, int(nums[0]) if nums else 0)
    t = int(nums[1]) if kind in ("led", "adapt") else 0
    # A lead shorter than the lookup's shortest match would never be taken.
    led_ok = lookup.LOOKUP_KEY <= t <= lookup.LOOKUP_LONGEST
    if not 0 <= r <= k or (kind == "led" and not led_ok) \
            or (kind == "adapt" and not r < t <= k):
        raise ValueError(f"rule {text!r}: r in 0..K={k}, T in {lookup.LOOKUP_KEY}.."
                         f"{lookup.LOOKUP_LONGEST}, lo < hi <= K")
    return kind, r, t


def vllm_ngram(tokens: np.ndarray, k: int, n: int = VLLM_NGRAM) -> np.ndarray:
    """vLLM 0.26's prompt lookup at its default sizes (min = max = n): the
    earliest earlier occurrence of the last n tokens, and up to k tokens
    after it (which may reach into the last n themselves)."""
    if len(tokens) <= n:
        return tokens[:0]
    windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # [L - n, n]
    hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
    if len(hits) == 0:
        return tokens[:0]
    start = hits[0] + n
    return tokens[start: start + k]


def score(prompt: list[int], answer: list[int], forecast: list[int] | None, k: int,
          rule: tuple[str, int, int]) -> tuple[int, int, int]:
    """(steps, proposals accepted, tokens drafted) over one answer under
    ``rule``; the first answer token is the prompt step's sample, so steps
    start after it."""
    kind, lo, t = rule
    # The last two steps: drafts held, nothing looked up held (or none was).
    misses = [False, False]
    truth = prompt + answer
    seq = torch.tensor(truth, dtype=torch.int32)
    array = np.asarray(truth)  # vLLM's ngram's view of it
    history = lookup.TokenHistory(1, len(seq), k, torch.device("cpu"))
    history.fill(0, seq)
    slot = torch.zeros(1, dtype=torch.int64)
    base = len(prompt)
    steps = accepted = drafted = 0
    bonus = base  # the sequence index of the step's bonus token
    while bonus + 1 < len(truth):
        r = t if kind == "adapt" and misses[0] else lo
        if kind == "ngram":
            proposed = vllm_ngram(array[: bonus + 1], k)
            truth_next = array[bonus + 1: bonus + 1 + len(proposed)]
            held = int(np.cumprod(proposed[: len(truth_next)] == truth_next).sum())
            steps, accepted = steps + 1, accepted + held
            bonus += 1 + held
            continue
        rows = lookup.LookupRows(slot, torch.tensor([bonus], dtype=torch.int64))
        held = 0
        for i in range(min(r, k)):  # the drafted positions
            at = bonus + 1 + i
            if at >= len(truth):
                break
            token = forecast[at - base]
            if kind == "led":
                prefix = seq[bonus + 1: at][None].to(torch.int64)  # right so far
                end, length = history.match(rows, prefix, 1)
                found, valid = history.followers(rows, end, 1)
                if bool(valid[0, 0]) and int(length[0]) >= t:
                    token = int(found[0, 0])
            if token != truth[at]:
                break
            held += 1
        if held == r and r < k:  # the looked-up positions
            drafts = seq[bonus + 1: bonus + 1 + r][None].to(torch.int64)
            if r == 0:  # keyed on the bonus token alone; no draft to repeat
                end, _ = history.match(rows, drafts, k)
                found, valid = history.followers(rows, end, k)
                proposed = torch.where(valid, found, -1)[0]
            else:
                proposed = history.look_up(rows, drafts, k - r)[0]
            for token in proposed.tolist():
                at = bonus + 1 + held
                if at >= len(truth) or token != truth[at]:
                    break
                held += 1
        misses = [misses[1], held == r]
        steps, accepted, drafted = steps + 1, accepted + held, drafted + min(r, k)
        bonus += 1 + held
    return steps, accepted, drafted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", required=True, help="the grid's cases.jsonl.gz")
    ap.add_argument("--outputs", required=True, type=Path,
                    help="the run.py result file of plain decoding the forecast read")
    ap.add_argument("--forecast", type=Path, nargs="+", default=None,
                    help="forecast.py's files, merged by prompt (the rules that draft)")
    ap.add_argument("--model", default=None,
                    help="the forecast's model (default: the first in the file)")
    ap.add_argument("--k", type=int, default=12)
    ap.add_argument("--rules", nargs="+", default=["draft", "then:3", "lookup"])
    ap.add_argument("--step-ms", type=float, default=5.7,
                    help="a step's cost without its drafted tokens (ms)")
    ap.add_argument("--draft-ms", type=float, default=1.15,
                    help="a drafted token's cost (ms)")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    try:
        rules = {text: parse_rule(text, args.k) for text in args.rules}
    except ValueError as e:
        ap.error(str(e))
    drafting = [t for t, (kind, r, _) in rules.items() if r > 0 or kind == "adapt"]
    if drafting and args.forecast is None:
        ap.error(f"rules {' '.join(drafting)} draft: give --forecast")
    try:
        header, prompts, records = answers.load(args.cases, args.outputs)
    except ValueError as e:
        ap.error(str(e))
    files = [json.loads(f.read_text()) for f in args.forecast or []]
    args.forecast = [str(f) for f in args.forecast or []]  # for the metadata
    if any(f["meta"].get("cases_sha256") != header["sha256"] for f in files):
        ap.error(f"--forecast: a file forecast other cases than {args.cases}")
    model = args.model or (next(iter(files[0]["models"])) if files else None)
    forecasts = None
    if files:
        if any(model not in f["models"] for f in files):
            ap.error(f"--forecast: not every file holds {model}")
        forecasts = {k: v for f in files
                     for k, v in f["models"][model]["forecast"].items()}
    records = [r for r in records if forecasts is None or r["id"] in forecasts]
    if forecasts and any(len(forecasts[r["id"]]) != len(r["output_ids"])
                         for r in records):
        ap.error("--forecast: forecasts of other answers than --outputs' "
                 "(lengths differ)")
    rows, per_prompt = [], {}
    for text, rule in rules.items():
        cells: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for r in records:
            steps, _, drafted = score(prompts[r["id"]], r["output_ids"],
                                      forecasts and forecasts[r["id"]], args.k, rule)
            # Tokens a step: the answer's after the first over its steps (a
            # last step that reaches the answer's end has no bonus token).
            tokens = len(r["output_ids"]) - 1
            per_prompt.setdefault(r["id"], {})[text] = round(tokens / max(steps, 1), 3)
            cell = cells[(r["group"], r["context"])]
            for i, v in enumerate((1, steps, tokens, drafted)):
                cell[i] += v
        for (group, context), (n, steps, tokens, drafted) in sorted(cells.items()):
            ms = steps * args.step_ms + drafted * args.draft_ms
            steps = max(steps, 1)
            rows.append({"rule": text, "k": args.k, "task": group, "context": context,
                         "prompts": n, "steps": steps,
                         "acc_len": round(tokens / steps, 3),
                         "drafted_per_step": round(drafted / steps, 2),
                         "est_ms_per_token": round(ms / max(tokens, 1), 3)})
    result = {"meta": run_metadata(args, cases_sha256=header["sha256"]), "model": model,
              "rows": rows, "per_prompt": per_prompt}
    answers.write(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
