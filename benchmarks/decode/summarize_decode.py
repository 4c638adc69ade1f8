"""Markdown table of a ``benchmarks.decode.bench_decode`` result file (modes side by
side; median (min–max) of the runs where a cell has several, and each run's
GPU busy share in brackets where the file has it): each mode's decode tok/s
after the first token, then after ``/ e2e`` its end-to-end tok/s (all output
tokens over the whole ``generate`` call) where the file has it; the note
under the table says whether the runs had fresh prompts (each paid its
prefill) or reused the warm-up's from the prefix cache.

    python -m benchmarks.decode.summarize_decode benchmarks/results/decode/<file>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

from benchmarks.harness.meta import device


def _tok(r: dict | None) -> str:
    if r is None:
        return "–"
    if "skipped" in r:
        return "skipped"
    tok = r["decode_tok_s"]
    if not isinstance(tok, dict):  # older files: one run per row
        return f"{tok:.0f}"
    e2e = r.get("e2e_tok_s")
    return (_spread(tok) + _busy(r)
            + (f" / e2e {_spread(e2e)}" if isinstance(e2e, dict) else ""))


def _spread(tok: dict) -> str:
    """``median (min–max)`` of a cell's runs; the median alone for one run."""
    if tok["n"] == 1:
        return f"{tok['median']:.0f}"
    return f"{tok['median']:.0f} ({tok['min']:.0f}–{tok['max']:.0f})"


def _busy(r: dict) -> str:
    """Each run's GPU busy share, as ` [97 99 98%]` (files before it: none)."""
    busy = [b for b in r.get("gpu_busy") or [] if b is not None]
    return f" [{' '.join(f'{100 * b:.0f}' for b in busy)}%]" if busy else ""


def _runs(r: dict) -> list[dict]:
    """The row's runs (older files: the row is its one run)."""
    return r.get("runs") or [r]


def _step(r: dict) -> str:
    runs = _runs(r)
    if not all(run.get("draft_timed", "draft_step_ms_median" in run) for run in runs):
        return "not timed"
    times = [run["draft_step_ms_median"] for run in runs
             if run.get("draft_step_ms_median") is not None]
    # None: the drafter never ran (a head shorter than the context, vLLM alone).
    return f"{statistics.median(times):.2f}" if times else "no draft"


def _plugin(r: dict) -> tuple[str, str]:
    """(draft context share, scoring share of decode) over the runs."""
    runs = [run for run in _runs(r) if run.get("spec_extend")]
    if not runs:
        return "", ""
    full = sum(run["spec_extend"].get("full_context_tokens", 0) for run in runs)
    draft = sum(run["spec_extend"].get("draft_context_tokens", 0) for run in runs)
    scoring = statistics.median(run["scoring_share_of_decode"] for run in runs)
    return f"{100 * draft / max(1, full):.1f}%", f"{100 * scoring:.1f}%"


def table(result: dict) -> str:
    rows = defaultdict(dict)
    for r in result["results"]:
        rows[(r["draft"] or "", r["context"], r["batch"])][r["mode"]] = r
    plain = {(k[1], k[2]): v["plain"] for k, v in rows.items() if "plain" in v}
    # The no-plugin speculative rows carry the method's name (older files: draft_model).
    method = result["meta"]["config"].get("method", "draft_model")
    plugin_modes = [m for m in ("spec_extend", "self_draft")
                    if any(m in modes for modes in rows.values())] or ["spec_extend"]
    lines = [
        f"| draft | context | batch | plain tok/s | {method} tok/s | "
        + " | ".join(f"{m} tok/s" for m in plugin_modes)
        + " | draft step ms (full KV → view) | draft context | scoring share |",
        "|---|---|---|---|---|" + "---|" * len(plugin_modes) + "---|---|---|",
    ]
    for (draft, ctx, batch), modes in sorted(rows.items()):
        if not draft and "self_draft" not in modes:
            continue
        dm, se = modes.get(method), modes.get("spec_extend")
        steps = share = scoring = ""
        if dm and se and "skipped" not in dm and "skipped" not in se:
            steps = f"{_step(dm)} → {_step(se)}"
            share, scoring = _plugin(se)
        lines.append(
            f"| {draft or '–'} | {ctx // 1024}K | {batch} "
            f"| {_tok(plain.get((ctx, batch)))} | {_tok(dm)} | "
            + " | ".join(_tok(modes.get(m)) for m in plugin_modes)
            + f" | {steps} | {share} | {scoring} |")
    meta, cfg = result["meta"], result["meta"]["config"]
    runs = f", {cfg['runs']} runs per cell" if "runs" in cfg else ""
    prompts = {True: "; fresh prompts in every run (each pays its prefill)",
               False: "; every run reuses the warm-up's prompts from the prefix "
                      "cache (no prefill in its figures)"}
    prompts = prompts.get(cfg.get("fresh_prompts"), "")
    lines.append(
        f"\n{device(meta)}, vLLM {meta['vllm']}, torch {meta['torch']}, "
        f"{meta['date_utc']}; synthetic acceptance length {cfg['acceptance_length']}, "
        f"K={cfg['num_spec_tokens']}, {cfg['output_len']} new tokens{runs}{prompts}.")
    for engine in result.get("engines", []):
        if "error" in engine:
            lines.append(f"\n{engine['mode']} engine failed: {engine['error']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    for path in parser.parse_args().files:
        print(table(json.load(open(path))))  # noqa: T201


if __name__ == "__main__":
    main()
