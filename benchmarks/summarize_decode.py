"""Markdown table of a ``bench_decode.py`` result file (modes side by side).

    python -m benchmarks.summarize_decode benchmarks/results/decode/<file>.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from benchmarks.harness.meta import device


def table(result: dict) -> str:
    rows = defaultdict(dict)
    for r in result["results"]:
        rows[(r["draft"] or "", r["context"], r["batch"])][r["mode"]] = r
    plain = {(k[1], k[2]): v["plain"] for k, v in rows.items() if "plain" in v}
    # The no-plugin speculative rows carry the method's name (older files: draft_model).
    method = result["meta"]["config"].get("method", "draft_model")
    lines = [
        f"| draft | context | batch | plain tok/s | {method} tok/s | +SpecExtend tok/s "
        "| draft step ms (full KV → view) | draft context | scoring share |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (draft, ctx, batch), modes in sorted(rows.items()):
        if not draft:
            continue
        dm, se = modes.get(method), modes.get("spec_extend")
        base = plain.get((ctx, batch))
        stats = (se or {}).get("spec_extend") or {}
        share = stats.get("draft_context_tokens", 0) / max(1, stats.get("full_context_tokens", 0))

        def tok(r):
            return f"{r['decode_tok_s']:.0f}" if r else "–"

        def step(r):
            # None: the drafter never ran (a head shorter than the context, vLLM alone).
            ms = r["draft_step_ms_median"]
            if not r.get("draft_timed", True):
                return "not timed"
            return "no draft" if ms is None else f"{ms:.2f}"

        lines.append(
            f"| {draft} | {ctx // 1024}K | {batch} | {tok(base)} | {tok(dm)} | {tok(se)} "
            f"| {step(dm)} → {step(se)} "
            f"| {100 * share:.1f}% | {100 * se['scoring_share_of_decode']:.1f}% |"
            if dm and se
            else f"| {draft} | {ctx // 1024}K | {batch} | {tok(base)} | {tok(dm)} | {tok(se)} | | | |"
        )
    meta = result["meta"]
    lines.append(
        f"\n{device(meta)}, vLLM {meta['vllm']}, torch {meta['torch']}, {meta['date_utc']}; "
        f"synthetic acceptance length {meta['config']['acceptance_length']}, "
        f"K={meta['config']['num_spec_tokens']}, {meta['config']['output_len']} new tokens."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    for path in parser.parse_args().files:
        print(table(json.load(open(path))))  # noqa: T201


if __name__ == "__main__":
    main()
