"""Merge the result files of one benchmark that separate device calls wrote
(a mode or a workload per call, to fit a call's time limit) into one file.

Every list of the files (``results``, ``engines``, ``servers``; ``runs`` in
older serve files) is concatenated in the order given; ``meta`` is the first
file's, with the modes of all files, the earliest date, and ``meta.calls``
keeping each call's modes, date and command. A merged ``benchmarks.serve.bench_serve``
result gets its ``summary.md`` and plots beside it;
``benchmarks.decode.bench_decode`` results go to
``benchmarks.decode.summarize_decode`` / ``benchmarks.decode.plot_decode``.
``--pool`` (decode files) makes the cells that several calls ran one cell:
their runs concatenated, the spreads recomputed, ``runs_from_calls`` beside
them (an A/B alternating calls on one machine pools each side's calls).

    python -m benchmarks.merge_results OUT_DIR/results.json CALL1.json CALL2.json ...
    python -m benchmarks.merge_results --pool OUT.json CALL1.json CALL3.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from benchmarks.harness.measure import spread
from benchmarks.harness.meta import config_switches, device, tuning_switches


def _lists(part: dict) -> list[str]:
    return [k for k, v in part.items() if isinstance(v, list)]


def _differ(values: list) -> bool:
    return any(v != values[0] for v in values)


def merge(parts: list[dict]) -> dict:
    keys = _lists(parts[0])
    if not keys or any(_lists(p) != keys for p in parts):
        raise ValueError("all files must come from the same benchmark")
    # The merged meta keeps the first file's config, and summarize labels
    # every row of a file by its plugin config: one config per merged file.
    if _differ([config_switches((p["meta"].get("config") or {}).get("spec_extend"))
                for p in parts]):
        raise ValueError("the files ran different plugin configs (--spec-extend): "
                         "merge a variant's calls on their own")
    meta = dict(parts[0]["meta"])
    modes = [m for p in parts for m in p["meta"]["config"]["modes"]]
    meta["config"] = dict(meta["config"], modes=list(dict.fromkeys(modes)))
    meta["date_utc"] = min(p["meta"]["date_utc"] for p in parts)
    meta["calls"] = [{"modes": p["meta"]["config"]["modes"],
                      "date_utc": p["meta"]["date_utc"],
                      "command": p["meta"]["command"]} for p in parts]
    # bench_serve --find-rate's probes: the call that ran them (the first
    # server's) holds them.
    probes = next(({"probes": p["probes"]} for p in parts if "probes" in p), {})
    return {"meta": meta, **{k: [item for p in parts for item in p[k]] for k in keys},
            **probes}


CELL = ("mode", "method", "draft", "context", "batch", "output_len",
        "tensor_parallel_size")
"""What makes two decode rows one cell."""


def pool(parts: list[dict]) -> dict:
    """``parts`` merged, each cell's decode rows as one row: runs in call
    order. The calls must have run one config (modes and file aside)."""
    if any(p["meta"].get("bench") != "decode" for p in parts):
        raise ValueError("--pool is for bench_decode files")
    configs = [{k: v for k, v in p["meta"]["config"].items() if k not in ("modes", "out")}
               for p in parts]
    if _differ(configs):
        raise ValueError("--pool needs calls of one config: "
                         + ", ".join(sorted({k for c in configs for k in c
                                             if c.get(k) != configs[0].get(k)})) + " differ")
    if _differ([device(p["meta"]) for p in parts]):
        raise ValueError("--pool needs calls on one kind of device")
    if _differ([tuning_switches({k: v for e in p.get("engines", [])
                                 for k, v in (e.get("plugin_env") or {}).items()})
                for p in parts]):
        raise ValueError("--pool needs calls with the same tuning switches "
                         "(SPECEXTEND_DRAFT_*, SPECEXTEND_EARLY_*)")
    merged = merge(parts)
    cells: dict[tuple, dict] = {}
    for row in merged["results"]:
        key = tuple(row.get(k) for k in CELL)
        if key not in cells:
            cells[key] = dict(row, runs=list(row.get("runs", [])), runs_from_calls=1)
            continue
        if "skipped" in row or "skipped" in cells[key]:
            raise ValueError(f"cannot pool a skipped cell: {dict(zip(CELL, key))}")
        cell = cells[key]
        cell["runs"] += row["runs"]
        cell["runs_from_calls"] += 1
    for cell in cells.values():
        runs = cell["runs"]
        if not runs:
            continue
        for metric in ("decode_tok_s", "e2e_tok_s", "ttft_s"):
            if all(metric in run for run in runs):  # ttft_s: newer files
                cell[metric] = spread(run[metric] for run in runs)
        cell["gpu_busy"] = [run.get("gpu_busy") for run in runs]
    return dict(merged, results=list(cells.values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--pool", action="store_true",
                        help="decode files: one cell of the runs of several calls")
    parser.add_argument("out", type=Path)
    parser.add_argument("parts", nargs="+", type=Path)
    args = parser.parse_args(argv)
    parts = [json.loads(p.read_text()) for p in args.parts]
    merged = pool(parts) if args.pool else merge(parts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=1))
    if merged["meta"].get("bench") == "serve":
        from benchmarks.serve.bench_serve import table

        (args.out.parent / "summary.md").write_text(table(merged) + "\n")
        if importlib.util.find_spec("matplotlib"):
            from benchmarks.serve.plot_serve import plot_all

            plot_all(merged, args.out.parent)
    print(args.out)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
