"""Merge the result files of one benchmark that separate device calls wrote
(one mode per call, to fit a call's time limit) into one file.

Rows are concatenated in the order given; ``meta`` is the first file's, with the
modes of all files, the earliest date, and ``meta.calls`` keeping each call's
modes, date and command. A merged ``bench_serve.py`` result (``runs``) gets its
``summary.md`` and ``serve.png`` beside it; ``bench_decode`` results
(``results``) go to ``benchmarks.summarize_decode`` / ``benchmarks.plot_decode``.

    python -m benchmarks.merge_results OUT_DIR/results.json CALL1.json CALL2.json ...
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path


def merge(parts: list[dict]) -> dict:
    key = "runs" if "runs" in parts[0] else "results"
    if any(key not in p for p in parts):
        raise ValueError("all files must come from the same benchmark")
    meta = dict(parts[0]["meta"])
    modes = [m for p in parts for m in p["meta"]["config"]["modes"]]
    meta["config"] = dict(meta["config"], modes=list(dict.fromkeys(modes)))
    meta["date_utc"] = min(p["meta"]["date_utc"] for p in parts)
    meta["calls"] = [{"modes": p["meta"]["config"]["modes"],
                      "date_utc": p["meta"]["date_utc"],
                      "command": p["meta"]["command"]} for p in parts]
    return {"meta": meta, key: [row for p in parts for row in p[key]]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("out", type=Path)
    parser.add_argument("parts", nargs="+", type=Path)
    args = parser.parse_args(argv)
    merged = merge([json.loads(p.read_text()) for p in args.parts])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=1))
    if "runs" in merged:
        from benchmarks.bench_serve import table

        (args.out.parent / "summary.md").write_text(table(merged) + "\n")
        if importlib.util.find_spec("matplotlib"):
            from benchmarks.plot_serve import plot

            plot(merged, args.out.parent / "serve.png")
    print(args.out)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
