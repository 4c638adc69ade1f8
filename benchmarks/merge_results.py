"""Merge the result files of one benchmark that separate device calls wrote
(a mode or a workload per call, to fit a call's time limit) into one file.

Every list of the files (``results``, ``engines``, ``servers``; ``runs`` in
older serve files) is concatenated in the order given; ``meta`` is the first
file's, with the modes of all files, the earliest date, and ``meta.calls``
keeping each call's modes, date and command. A merged ``benchmarks.bench_serve``
result gets its ``summary.md`` and plots beside it; ``benchmarks.bench_decode``
results go to ``benchmarks.summarize_decode`` / ``benchmarks.plot_decode``.

    python -m benchmarks.merge_results OUT_DIR/results.json CALL1.json CALL2.json ...
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path


def _lists(part: dict) -> list[str]:
    return [k for k, v in part.items() if isinstance(v, list)]


def merge(parts: list[dict]) -> dict:
    keys = _lists(parts[0])
    if not keys or any(_lists(p) != keys for p in parts):
        raise ValueError("all files must come from the same benchmark")
    meta = dict(parts[0]["meta"])
    modes = [m for p in parts for m in p["meta"]["config"]["modes"]]
    meta["config"] = dict(meta["config"], modes=list(dict.fromkeys(modes)))
    meta["date_utc"] = min(p["meta"]["date_utc"] for p in parts)
    meta["calls"] = [{"modes": p["meta"]["config"]["modes"],
                      "date_utc": p["meta"]["date_utc"],
                      "command": p["meta"]["command"]} for p in parts]
    return {"meta": meta, **{k: [item for p in parts for item in p[k]] for k in keys}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("out", type=Path)
    parser.add_argument("parts", nargs="+", type=Path)
    args = parser.parse_args(argv)
    merged = merge([json.loads(p.read_text()) for p in args.parts])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=1))
    if merged["meta"].get("bench") == "serve":
        from benchmarks.bench_serve import table

        (args.out.parent / "summary.md").write_text(table(merged) + "\n")
        if importlib.util.find_spec("matplotlib"):
            from benchmarks.plot_serve import plot_all

            plot_all(merged, args.out.parent)
    print(args.out)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
