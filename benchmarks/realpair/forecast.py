"""A model's own greedy token at every position of plain decoding's answers,
teacher-forced over the whole prompt (full KV): the draft's forecast.

Why: what a drafting rule gets accepted on a prompt depends only on the
answer (plain decoding's greedy output, which every lossless mode
reproduces), on the lookup's tokens (``drafting/lookup.py``) and on what the
draft model would propose at each position. While every proposal so far was
right, the draft's next proposal is its greedy token after the answer's true
prefix, so one teacher-forced forward over ``prompt + answer`` gives every
proposal a rule can draw from the draft before its first miss, and the miss
ends the step. With it a rule that mixes the draft's and the lookup's tokens
(``rules.py``) is scored offline, exactly for a draft that
reads the whole context (vLLM's ``draft_model``; the plugin's draft reads its
view, whose acceptance the grid measures).

``forecast[i]`` is the model's token after ``prompt + answer[:i]``: index 0
predicts the answer's first token (the target's own prompt sample, never
drafted). Transformers on the converted checkpoint (``qwen_pair convert``),
logits only at the answer's positions.

    python -m benchmarks.realpair.forecast --cases CASES --outputs PLAIN.json \\
        --model DIR [--model DIR ...] --out FILE.json [--cells copy:30720 ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.harness.meta import run_metadata
from benchmarks.realpair import answers


def forecast(model, prompt: list[int], answer: list[int]) -> list[int]:
    """The model's greedy token after ``prompt + answer[:i]`` for every i in
    ``range(len(answer))`` (one forward; logits at those positions only)."""
    if not answer:
        return []
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + answer[:-1]], dtype=torch.int64, device=device)
    with torch.inference_mode():
        hidden = model.model(input_ids=ids).last_hidden_state[0]  # [T, H]
        logits = model.lm_head(hidden[len(prompt) - 1:])  # [A, V]
        return logits.argmax(dim=-1).tolist()


def load(path: str, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM  # the host has it with vLLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                 attn_implementation="sdpa")
    return model.to(device).eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", required=True, help="the grid's cases.jsonl.gz")
    ap.add_argument("--outputs", required=True, type=Path,
                    help="a run.py result file of plain decoding (its greedy outputs)")
    ap.add_argument("--model", required=True, action="append",
                    help="a converted checkpoint (the draft; the target as a check)")
    ap.add_argument("--cells", nargs="*", default=None,
                    help="group:context cells to forecast (default: every batch-1 one)")
    ap.add_argument("--limit", type=int, default=None, help="prompts a cell (a probe)")
    ap.add_argument("--skip", nargs="*", default=[], help="prompt ids left out")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)

    try:
        header, prompts, answered = answers.load(args.cases, args.outputs)
    except ValueError as e:
        ap.error(str(e))
    wanted = None if args.cells is None else {tuple(c.split(":")) for c in args.cells}
    if wanted and any(len(c) != 2 or not c[1].isdigit() for c in wanted):
        ap.error("--cells: group:context, such as copy:30720")
    if len({Path(m).name for m in args.model}) != len(args.model):
        ap.error("--model: two checkpoints of one folder name")
    records, per_cell = [], {}
    for r in answered:
        cell = (r["group"], str(r["context"]))
        if r["id"] in args.skip or (wanted and cell not in wanted):
            continue
        per_cell[cell] = per_cell.get(cell, 0) + 1
        if args.limit is None or per_cell[cell] <= args.limit:
            records.append(r)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    result = {"meta": run_metadata(args, cases_sha256=header["sha256"]),
              "outputs": str(args.outputs), "models": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for path in args.model:
        t0 = time.perf_counter()
        model = load(path, args.device, dtype)
        rows = {}
        entry = result["models"][Path(path).name] = {"path": path, "forecast": rows}
        for r in records:
            rows[r["id"]] = forecast(model, prompts[r["id"]], r["output_ids"])
            same = sum(a == b for a, b in zip(rows[r["id"]], r["output_ids"]))
            print(f"{Path(path).name} {r['id']}: {same} of "  # noqa: T201
                  f"{len(rows[r['id']])} tokens as the answer's", flush=True)
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            args.out.write_text(json.dumps(result))  # each prompt's as it comes
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
