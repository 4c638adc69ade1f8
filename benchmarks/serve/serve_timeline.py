"""Where each serving run's decode window went, recomputed from the
per-request records that ``vllm bench serve --save-detailed`` left in a
``bench_serve`` output directory (``bench/*_run*.json``, inside the archive a
``host_run.sh serve12`` call brings back): the figures ``bench_serve`` records
per run since ``burst_shape`` (earlier result files lack them).

    python -m benchmarks.serve.serve_timeline OUT.json DIR [DIR ...]

Writes OUT.json (per run: decode window, first-token spread, the last first
token's request's decode time, tokens per streamed chunk, and per request its
[first token, last token] in seconds from the run's first request start, and
output tokens) and OUT.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.harness.measure import spread
from benchmarks.serve.bench_serve import _s, request_spans, stream_figures

FIGURES = ("decode_s", "decode_tok_s", "first_token_spread_s", "last_request_decode_s",
           "tokens_per_chunk")


def run_timeline(bench: dict) -> dict:
    """One run's figures (``bench_serve.stream_figures``: ``decode_phase``'s
    without GPU busy) and its requests, timed from the first request's start."""
    t0 = min(bench["start_times"], default=0.0)
    requests = request_spans(bench)
    figures = stream_figures(bench, requests)
    return {**{k: figures[k] for k in FIGURES},
            "requests": [[round(first - t0, 4), round(last - t0, 4), n]
                         for first, last, n in requests]}


def timeline(dirs: list[Path]) -> dict:
    runs = []
    for d in dirs:
        for path in sorted(Path(d).glob("bench/*_run*.json")):
            runs.append({"dir": Path(d).name, "file": path.name,
                         **run_timeline(json.loads(path.read_text()))})
    if not runs:
        raise SystemExit(f"no bench/*_run*.json under {', '.join(map(str, dirs))}")
    return {"runs": runs}


def table(result: dict) -> str:
    """A line per run group (a directory and the file name before ``_run``):
    median (min–max) of each figure over its runs that produced tokens (a
    run whose requests all failed has no decode window, not one of 0 s)."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in result["runs"]:
        groups.setdefault((run["dir"], run["file"].rsplit("_run", 1)[0]), []).append(run)
    out = ["| directory | runs | decode window s | decode tok/s "
           "| first tokens over s | last first token's request: decode s "
           "| tokens per streamed chunk |",
           "|---|---|---|---|---|---|---|"]
    for (d, name), runs in groups.items():
        timed = [r for r in runs if r["requests"]]
        cells = [_s(spread([r[key] for r in timed if r[key] is not None]), 1)
                 for key in FIGURES]
        count = (str(len(runs)) if len(timed) == len(runs)
                 else f"{len(runs)} ({len(runs) - len(timed)} without tokens)")
        out.append(f"| {d}/{name} | {count} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("dirs", nargs="+", type=Path)
    args = p.parse_args()
    result = timeline(args.dirs)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(table(result) + "\n")
    print(table(result))


if __name__ == "__main__":
    main()
