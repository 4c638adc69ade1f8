"""``benchmarks/results/realpair/summary.json`` from the per-prompt result files.

A row per (mode, k, task, context, batch) of every run folder under
``benchmarks/results/realpair/`` (each folder: one host, one session, a file
per mode written by ``run.py``):

* ``prompts``; ``right``: answers that ``tasks.check`` accepts (None where
  the task has no check);
* ``acc_len``: 1 + accepted / drafts over the cell (vLLM's counters; prompt
  lookup counts only the steps where it proposed); 1.0 for plain;
* ``e2e_tok_s``: output tokens over the ``generate`` calls' seconds, prefill
  included; ``e2e_min/median/max``: per call (a prompt at batch 1, eight at
  batch 8);
* ``decode_tok_s``: tokens after each request's first over the seconds from
  its first token to its last (batch 8: a batch's tokens after their first
  over the span from its first first-token to its last token);
* ``ttft_s``: median first-token latency; ``gpu_busy``: mean NVML busy share
  over the calls;
* ``equal_to_plain``: prompts whose greedy output equals plain's (same batch
  size; None without a plain run in the folder); ``differs``: the first
  differing token index of each other prompt;
* ``device``, ``file``.

    python -m benchmarks.realpair.summarize            # writes summary.json
    python -m benchmarks.realpair.summarize --table    # and prints the markdown
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from benchmarks.harness.meta import REPO_ROOT, device

RESULTS = REPO_ROOT / "benchmarks" / "results" / "realpair"
KEY = ("mode", "k", "task", "context", "batch")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter's
    length where one is a prefix of the other); None where equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _calls(records: list[dict]) -> list[list[dict]]:
    """The records grouped by ``generate`` call (one at batch 1)."""
    calls: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        calls[r["call"]].append(r)
    return list(calls.values())


def cell_row(records: list[dict], plain: dict[tuple, list[int]] | None) -> dict:
    """The summary row of one cell's records (one mode, k, task, context, batch)."""
    calls = _calls(records)
    tokens = sum(r["output_tokens"] for r in records)
    e2e = sum(c[0]["e2e_s"] for c in calls)
    per_call = sorted(sum(r["output_tokens"] for r in c) / c[0]["e2e_s"] for c in calls)
    decode_tokens = sum(max(0, r["output_tokens"] - 1) for r in records)
    decode_s = 0.0
    for c in calls:
        if any(r["first_ts"] is None for r in c):
            decode_s = None
            break
        decode_s += max(r["last_ts"] for r in c) - min(r["first_ts"] for r in c) \
            if len(c) > 1 else c[0]["decode_s"]
    specs = [c[0]["spec"] for c in calls if c[0].get("spec")]
    drafts = sum(s["drafts"] for s in specs)
    acc_len = 1.0 if not specs else (1 + sum(s["accepted_tokens"] for s in specs) / drafts
                                     if drafts else None)
    checks = [r["right"] for r in records if r["right"] is not None]
    busy = [c[0]["gpu_busy"] for c in calls if c[0].get("gpu_busy") is not None]
    equal = differs = None
    if plain is not None:
        equal, differs = 0, {}
        for r in records:
            base = plain.get((r["id"], r["batch"]))
            at = None if base is None else first_difference(r["output_ids"], base)
            if base is not None and at is None:
                equal += 1
            else:
                differs[r["id"]] = at
    ttfts = [r["ttft_s"] for r in records if r["ttft_s"] is not None]
    return {
        "prompts": len(records),
        "right": len([c for c in checks if c]) if checks else None,
        "acc_len": None if acc_len is None else round(acc_len, 3),
        "e2e_tok_s": round(tokens / e2e, 1),
        "e2e_min": round(per_call[0], 1), "e2e_median": round(statistics.median(per_call), 1),
        "e2e_max": round(per_call[-1], 1),
        "decode_tok_s": round(decode_tokens / decode_s, 1) if decode_s else None,
        "ttft_s": round(statistics.median(ttfts), 4) if ttfts else None,
        "gpu_busy": round(sum(busy) / len(busy), 3) if busy else None,
        "output_tokens": tokens,
        "equal_to_plain": equal, "differs": differs or None,
    }


def folder_rows(folder: Path) -> list[dict]:
    """Rows of one run folder (its ``*.json`` result files)."""
    files = sorted(p for p in folder.glob("*.json") if p.name != "summary.json")
    loaded = [(p, json.loads(p.read_text())) for p in files]
    plain = None
    for _, result in loaded:
        if result["mode"] == "plain":
            plain = {(r["id"], r["batch"]): r["output_ids"] for r in result["records"]}
    rows = []
    for path, result in loaded:
        cells: dict[tuple, list[dict]] = defaultdict(list)
        for r in result["records"]:
            cells[(r["group"], r["context"], r["batch"])].append(r)
        for (task, context, batch), records in sorted(cells.items()):
            rows.append({"mode": result["mode"], "k": result["k"], "task": task,
                         "context": context, "batch": batch,
                         **cell_row(records, plain),
                         "device": device(result["meta"]),
                         "vllm": result["meta"].get("vllm"),
                         "commit": result["meta"].get("git_commit"),
                         "date_utc": result["meta"].get("date_utc"),
                         "file": f"{RESULTS.relative_to(REPO_ROOT)}/{folder.name}/{path.name}"})
    return rows


def summary(root: Path = RESULTS) -> list[dict]:
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        rows += folder_rows(folder)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: a line per row, ratios to plain of the same folder and cell."""
    plain = {(r["file"].rsplit("/", 1)[0], r["task"], r["context"], r["batch"]): r
             for r in rows if r["mode"] == "plain"}
    out = ["| task | context | batch | mode | k | acc_len | e2e tok/s (× plain) | "
           "decode tok/s (× plain) | TTFT s | right | = plain | GPU busy |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["task"], r["context"], r["batch"],
                                         r["file"], r["mode"], r["k"] or 0)):
        base = plain.get((r["file"].rsplit("/", 1)[0], r["task"], r["context"], r["batch"]))

        def ratio(key, r=r, base=base):
            if not base or not r[key] or not base[key]:
                return f"{r[key]}"
            return f"{r[key]} ({r[key] / base[key]:.2f}×)"
        out.append(f"| {r['task']} | {r['context']} | {r['batch']} | {r['mode']} | "
                   f"{r['k'] or '-'} | {r['acc_len']} | {ratio('e2e_tok_s')} | "
                   f"{ratio('decode_tok_s')} | {r['ttft_s']} | "
                   f"{r['right']}/{r['prompts']} | {r['equal_to_plain']} | "
                   f"{r['gpu_busy']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=RESULTS)
    ap.add_argument("--table", action="store_true")
    args = ap.parse_args(argv)
    rows = summary(args.root)
    (args.root / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    if args.table:
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
