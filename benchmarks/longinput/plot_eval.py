"""Plots of benchmarks/longinput/eval_longinput.py results (matplotlib, the
``bench`` extra).

    python -m benchmarks.longinput.plot_eval R.json [R2.json ...] --out-dir DIR

Writes ``accepted_length.png`` and ``decode_tok_s.png`` (metric vs input
length, one line per mode, working set and scoring layer, one panel per
dataset; accepted length with its 95% interval) from the ``eval`` rows (no
``decode_tok_s.png`` where any run shared its GPU: its tok/s are no speed
results), and ``needle.png`` (the draft's passkey token match vs depth, one panel per
length) when there are ``needle`` rows. Several files are merged first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.longinput import engine, report

METRICS = {
    "accepted_length": ("mean_accepted_length", "accepted length (incl. bonus)"),
    "decode_tok_s": ("decode_tok_s", "decode tokens/s"),
}


def panels(plt, count: int):
    fig, axes = plt.subplots(1, count, figsize=(5 * count, 4), squeeze=False)
    return fig, axes[0]


def line_of(row: dict) -> tuple[tuple, str]:
    """The line a row belongs to: a sort key and a label, one line per mode,
    working set and (for retrieval) scoring layer."""
    label, working_set = row["mode"], row.get("working_set") or 0
    layer = report.engine_score_layer(row)
    if not (engine.policy(row["mode"]) == "cmr" and layer not in (None, -1)):
        layer = -1
    if working_set:
        label += f" {working_set}"
    if layer != -1:
        label += f" layer {layer}"
    return (report.MODE_ORDER[row["mode"]], working_set, layer), label


def lines(rows: list[dict], key: str) -> dict[str, list[tuple]]:
    """label -> [(length, value, (below, above))] sorted by length, lines in
    mode, working set and layer order; the error is the 95% interval where
    the row has one (accepted length), else 0. One point per line and length:
    where engines of several scoring layers ran a mode that ranks nothing
    (streaming, full KV), the default layer's engine's row."""
    found: dict[tuple, dict[int, tuple]] = {}
    for r in rows:
        low, high = r.get("accepted_length_ci95") or (None, None)
        err = ((0.0, 0.0) if low is None or key != "mean_accepted_length"
               else (r[key] - low, high - r[key]))
        default = report.engine_score_layer(r) in (None, -1)
        points = found.setdefault(line_of(r), {})
        if r["length"] not in points or (default and not points[r["length"]][0]):
            points[r["length"]] = (default, (r["length"], r[key], err))
    return {label: sorted(point for _, point in points.values())
            for (_, label), points in sorted(found.items())}


def plot_eval(plt, rows: list[dict], out_dir: Path, speed: bool = True) -> list[Path]:
    rows = [r for r in rows if r["task"] == "eval"]
    if not rows:
        return []
    datasets = sorted({r["dataset"] for r in rows})
    lengths = sorted({r["length"] for r in rows})
    written = []
    for name, (key, label) in METRICS.items():
        if key == "decode_tok_s" and not speed:
            continue
        fig, axes = panels(plt, len(datasets))
        for ax, dataset in zip(axes, datasets, strict=True):
            # Plain decoding's accepted length is 1 by definition: no line.
            here = [r for r in rows if r["dataset"] == dataset
                    and not (key == "mean_accepted_length" and r["mode"] == "none")]
            # tab20: a colour of its own for each of up to 20 lines.
            for i, (line, points) in enumerate(lines(here, key).items()):
                x, y, err = zip(*points, strict=True)
                ax.errorbar(x, y, yerr=list(zip(*err, strict=True)), marker="o",
                            capsize=3, label=line, color=plt.cm.tab20(i % 20))
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths)
            ax.set_xticklabels([f"{n // 1024}K" if n >= 1024 else str(n) for n in lengths])
            ax.set(title=dataset, xlabel="input length (tokens)", ylabel=label)
            ax.grid(alpha=0.3)
        if axes[0].get_legend_handles_labels()[0]:  # no lines: no legend
            axes[0].legend(fontsize="small")
        written.append(save(fig, out_dir / f"{name}.png"))
    return written


def plot_needle(plt, rows: list[dict], out_dir: Path) -> list[Path]:
    # The draft is scored only where the target found the key.
    summary = [s for s in report.needle_summary(rows)
               if s["token_match_rate"] is not None]
    if not summary:
        return []
    lengths = sorted({s["length"] for s in summary})
    fig, axes = panels(plt, len(lengths))
    for ax, length in zip(axes, lengths, strict=True):
        here = [s for s in summary if s["length"] == length]
        for mode in sorted({s["mode"] for s in here}, key=report.MODE_ORDER.get):
            points = sorted((s["depth"], s["token_match_rate"]) for s in here
                            if s["mode"] == mode)
            ax.plot(*zip(*points, strict=True), marker="o", label=mode)
        ax.set(title=f"{length} tokens", xlabel="passkey depth",
               ylabel="draft match on passkey tokens", ylim=(-0.05, 1.05))
        ax.grid(alpha=0.3)
    axes[0].legend()
    return [save(fig, out_dir / "needle.png")]


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(Path(f).read_text()) for f in args.files]
    rows = report.merge(results)["rows"]
    shared = any(report.shared_gpu(result) for result in results)
    if shared:
        print("some runs shared the GPU (--shared-gpu): no decode_tok_s.png")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in (plot_eval(plt, rows, out_dir, speed=not shared)
                 + plot_needle(plt, rows, out_dir)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
