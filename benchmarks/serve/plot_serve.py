"""Decode-phase tok/s (tokens after each request's first, over that time) and
TPOT against concurrency, one line per mode (and method
under the plugin: ``benchmarks.serve.series.series``), error bars from the runs
(min to max around the median): one PNG per workload and input length of a
``benchmarks.serve.bench_serve`` result (``serve_rate_*.png``: its rows at request
rates, against the rate). Needs matplotlib (the ``bench``
extra); ``bench_serve`` calls it itself where matplotlib is installed.

With ``--summary``, the same plots over the README's serving table instead:
per device, workload and input length measured at two concurrencies or more,
every cell from the newest result file that holds it, variants left out
(``benchmarks.summarize``'s rule), so a line may join cells of several
sessions (each cell's modes come from one; the title counts the files).

    python -m benchmarks.serve.plot_serve DIR/results.json [--out-dir DIR]
    python -m benchmarks.serve.plot_serve --summary benchmarks/results/summary.json \\
        --out-dir DIR
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from benchmarks.harness.meta import device
from benchmarks.serve.series import inputs, rated, series, series_key


def _x(row: dict) -> float:
    """A row's place on the x axis: its request rate, else its concurrency."""
    return row["request_rate"] if rated(row) else row["concurrency"]


def _errorbar(ax, rows: list[dict], key: str, style: str, label: str, color=None):
    x = [_x(r) for r in rows]
    mid = [r[key]["median"] for r in rows]
    err = [[m - r[key]["min"] for m, r in zip(mid, rows, strict=True)],
           [r[key]["max"] - m for m, r in zip(mid, rows, strict=True)]]
    line = ax.errorbar(x, mid, yerr=err, fmt=style, capsize=3, label=label,
                       color=color)
    return line.lines[0].get_color()


def _line(row: dict, cells: list[dict]) -> tuple[int, str]:
    """``series_key``, the draft added to the name where the plot's cells of
    that series hold several drafts (a summary plot: a line per draft, not one
    line joining two drafts' cells)."""
    order, name = series_key(row)
    drafts = {r.get("draft") for r in cells if series(r) == name}
    if len(drafts) > 1:
        name = f"{name}, {row.get('draft') or 'no draft'}"
    return order, name


def figure(result: dict, workload: str, input_len: int, at_rate: bool = False):
    """The figure of one workload and input length, its rows in bursts or at
    request rates (``plot`` saves it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput, tpot) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    # Decode-phase throughput, as the figures compare: output tok/s
    # also carries the prompt pass, which the draft lengthens.
    cells = [r for r in result["results"] if (r["workload"], r["input_len"], rated(r))
             == (workload, input_len, at_rate) and r["decode_tok_s"]["n"]]
    lines = [(_line(r, cells), r) for r in cells]
    for key in sorted({key for key, _ in lines}):
        name = key[1]
        rows = sorted((r for k, r in lines if k == key), key=_x)
        color = _errorbar(tput, rows, "decode_tok_s", "o-", name)
        _errorbar(tpot, rows, "tpot_p50_ms", "o-", f"{name} p50", color)
        _errorbar(tpot, rows, "tpot_p99_ms", "x--", f"{name} p99", color)
    ticks = sorted({_x(r) for r in cells})
    for ax, ylabel in ((tput, "decode-phase tokens/s"), (tpot, "TPOT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, labels=[f"{t:g}" for t in ticks])
        ax.set_xlabel("request rate (req/s)" if at_rate else "concurrency")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    meta, cfg = result["meta"], result["meta"]["config"]
    out_len, shown = ((cells[0]["output_len"], inputs(cells[0])) if cells
                      else ("?", f"{input_len}-token inputs"))
    drafts = Path(cfg["draft"] or "-").name
    sources = ""
    if len(meta.get("files", ())) > 1:  # from_summary: cells of several files
        drafts = ", ".join(sorted({r["draft"] for r in cells if r["draft"]})) or "-"
        sources = f"; cells from {len(meta['files'])} result files"
    fig.suptitle(f"{workload}: {Path(cfg['target']).name} / {drafts}, {shown}, "
                 f"{out_len} output tokens\n{device(meta)}, vLLM {meta['vllm']}, "
                 f"median and min–max of {cfg['runs']} runs{sources}", fontsize=10)
    return fig


def plot(result: dict, workload: str, input_len: int, out: Path,
         at_rate: bool = False) -> Path:
    import matplotlib.pyplot as plt

    fig = figure(result, workload, input_len, at_rate)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_all(result: dict, out_dir: Path) -> list[Path]:
    """``serve_<workload>_<input len>.png`` for every workload and length
    (``serve_rate_...``: the rows at request rates)."""
    groups = dict.fromkeys((r["workload"], r["input_len"], rated(r))
                           for r in result["results"])
    return [plot(result, w, n,
                 Path(out_dir) / f"serve_{'rate_' if at_rate else ''}{w}_{n}.png",
                 at_rate)
            for w, n, at_rate in groups]


def from_summary(rows: list[dict], results_dir: Path) -> dict[tuple, dict]:
    """Per (device, workload, input length) with cells at two concurrencies or
    more: a result holding the summary's headline cells, each the newest
    file's row for its draft, concurrency and mode, variants left out.
    ``meta`` is the newest file's, with ``files`` listing every file used."""
    from benchmarks.summarize import file_age, newest, variant

    rows = [r for r in rows if r.get("bench") == "serve" and r["tok_s"]
            and not r.get("variant")]
    groups: dict[tuple, dict] = {}
    for key in dict.fromkeys((r["device"], r["workload"], r["context"]) for r in rows):
        mine = [r for r in rows if (r["device"], r["workload"], r["context"]) == key]
        cells = newest(mine, lambda r: (r["draft"], r["concurrency"], r["mode"]))
        if len({r["concurrency"] for r in cells.values()}) < 2:
            continue
        files = sorted({r["file"] for r in cells.values()}, key=file_age)
        loaded = {f: json.loads((results_dir / f).read_text()) for f in files}
        results = [x for (draft, conc, mode), r in cells.items()
                   for x in loaded[r["file"]]["results"]
                   if (x["workload"], x["input_len"], x["concurrency"], x["mode"], x["draft"])
                   == (key[1], key[2], conc, mode, draft)
                   and variant(loaded[r["file"]], mode, x) is None]
        groups[key] = {"meta": {**loaded[files[-1]]["meta"], "files": files},
                       "results": results}
    return groups


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("results", type=Path, nargs="?")
    parser.add_argument("--summary", type=Path,
                        help="plot the README's serving cells from this summary.json")
    parser.add_argument("--out-dir", type=Path, help="default: beside RESULTS")
    args = parser.parse_args(argv)
    if (args.results is None) == (args.summary is None):
        parser.error("give a RESULTS file or --summary, not both")
    if args.summary:
        if args.out_dir is None:
            parser.error("--summary needs --out-dir")
        args.out_dir.mkdir(parents=True, exist_ok=True)
        groups = from_summary(json.loads(args.summary.read_text()), args.summary.parent)
        for (dev, workload, length), result in groups.items():
            # "NVIDIA H100 80GB HBM3" -> h100
            gpu = re.split(r"[^a-z0-9]+", dev.lower().removeprefix("nvidia "))[0]
            name = f"serve_{gpu}_{workload}_{length}.png"
            print(plot(result, workload, length, args.out_dir / name))  # noqa: T201
        return
    out_dir = args.out_dir or args.results.parent
    for path in plot_all(json.loads(args.results.read_text()), out_dir):
        print(path)  # noqa: T201


if __name__ == "__main__":
    main()
