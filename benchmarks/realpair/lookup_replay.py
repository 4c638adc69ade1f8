"""The plugin's lookup replayed on the target's real outputs, offline (CPU).

Why: what the lookup's rule (``drafting/lookup.py``: the shortest match
taken, the longest counted) gets accepted depends only on tokens, so it can
be judged on a grid's prompts and plain decoding's greedy outputs without a
GPU. Each step of a prompt's answer is replayed as the plugin runs it: the
verified context ends with the step's bonus token, the draft model's
``--drafted`` tokens are taken as right (its share is the GPU grid's to
measure), and ``TokenHistory.look_up`` proposes ``--looked-up`` tokens,
accepted up to the first that differs from the answer; the step then moves
past them, as verification does. So the figures are what the lookup adds
where the draft holds: an upper bound of its share per step (a real run's
steps fall at other positions), comparable between rules, not an accepted
length. The cases must be the outputs' (``cases_sha256``).

    python -m benchmarks.realpair.lookup_replay --cases CASES \\
        --outputs benchmarks/results/realpair/<run>/plain_k4.json --out FILE.json
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from benchmarks.harness.meta import run_metadata
from benchmarks.realpair import answers
from vllm_specextend.drafting import lookup


def replay(prompt: list[int], answer: list[int], drafted: int, looked_up: int,
           min_match: int, longest: int) -> tuple[int, int]:
    """(steps, looked-up tokens accepted) over one answer; a step past the
    answer's end (fewer than ``drafted`` tokens left) is not counted."""
    seq = torch.tensor(prompt + answer, dtype=torch.int32)
    history = lookup.TokenHistory(1, len(seq), drafted + looked_up, torch.device("cpu"),
                                  min_match=min_match)
    history.fill(0, seq)
    slots = torch.zeros(1, dtype=torch.int64)
    saved, lookup.LOOKUP_LONGEST = lookup.LOOKUP_LONGEST, longest
    try:
        steps = accepted = 0
        bonus = len(prompt)  # the first answer token: the prompt step's sample
        while bonus + drafted < len(seq):
            drafts = seq[bonus + 1: bonus + 1 + drafted][None].to(torch.int64)
            rows = lookup.LookupRows(slots, torch.tensor([bonus], dtype=torch.int64))
            proposed = history.look_up(rows, drafts, looked_up)[0]
            truth = seq[bonus + 1 + drafted: bonus + 1 + drafted + looked_up]
            same = (proposed[:len(truth)].to(torch.int32) == truth).to(torch.int32)
            k = int(same.cumprod(0).sum())
            steps, accepted = steps + 1, accepted + k
            bonus += 1 + drafted + k
    finally:
        lookup.LOOKUP_LONGEST = saved
    return steps, accepted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", required=True, help="the grid's cases.jsonl.gz")
    ap.add_argument("--outputs", required=True, type=Path,
                    help="a run.py result file of plain decoding (its greedy outputs)")
    ap.add_argument("--drafted", type=int, default=3)
    ap.add_argument("--looked-up", type=int, default=9)
    ap.add_argument("--min-match", type=int, nargs="+", default=[lookup.LOOKUP_KEY])
    ap.add_argument("--longest", type=int, nargs="+", default=[lookup.LOOKUP_LONGEST])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    if min(args.min_match) < 1 or any(m > n for m in args.min_match for n in args.longest):
        ap.error("--min-match: 1 to the smallest --longest")

    try:
        header, prompts, records = answers.load(args.cases, args.outputs)
    except ValueError as e:
        ap.error(str(e))
    rows = []
    for min_match in args.min_match:
        for longest in args.longest:
            cells: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
            for r in records:
                steps, accepted = replay(prompts[r["id"]], r["output_ids"], args.drafted,
                                         args.looked_up, min_match, longest)
                cell = cells[(r["group"], r["context"])]
                cell[0] += 1
                cell[1] += steps
                cell[2] += accepted
            for (group, context), (n, steps, accepted) in sorted(cells.items()):
                rows.append({
                    "task": group, "context": context, "prompts": n,
                    "min_match": min_match, "longest": longest, "steps": steps,
                    "looked_up_per_step": round(accepted / steps, 3),
                    # Bonus, drafts and accepted looked-up tokens a step.
                    "tokens_per_step": round(1 + args.drafted + accepted / steps, 3),
                })
    result = {"meta": run_metadata(args, cases_sha256=header["sha256"]),
              "drafted": args.drafted,
              "looked_up": args.looked_up, "outputs": str(args.outputs), "rows": rows}
    answers.write(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
