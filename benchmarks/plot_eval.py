"""Plots of benchmarks/eval_longinput.py results (matplotlib, the ``bench`` extra).

    python -m benchmarks.plot_eval R.json [R2.json ...] --out-dir DIR

Writes ``accepted_length.png`` and ``decode_tok_s.png`` (metric vs input
length, one line per mode, one panel per dataset) from the ``eval`` rows, and
``needle.png`` (the draft's passkey token match vs depth, one panel per
length) when there are ``needle`` rows. Several files are merged first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.longinput import report

METRICS = {
    "accepted_length": ("mean_accepted_length", "accepted length (incl. bonus)"),
    "decode_tok_s": ("decode_tok_s", "decode tokens/s"),
}


def panels(plt, count: int):
    fig, axes = plt.subplots(1, count, figsize=(5 * count, 4), squeeze=False)
    return fig, axes[0]


def plot_eval(plt, rows: list[dict], out_dir: Path) -> list[Path]:
    rows = [r for r in rows if r["task"] == "eval"]
    if not rows:
        return []
    datasets = sorted({r["dataset"] for r in rows})
    modes = sorted({r["mode"] for r in rows}, key=report.MODE_ORDER.get)
    written = []
    for name, (key, label) in METRICS.items():
        fig, axes = panels(plt, len(datasets))
        for ax, dataset in zip(axes, datasets, strict=True):
            for mode in modes:
                points = sorted((r["length"], r[key]) for r in rows
                                if r["dataset"] == dataset and r["mode"] == mode)
                ax.plot(*zip(*points, strict=True), marker="o", label=mode)
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted({r["length"] for r in rows}))
            ax.set_xticklabels([f"{n // 1024}K" if n >= 1024 else str(n)
                                for n in sorted({r["length"] for r in rows})])
            ax.set(title=dataset, xlabel="input length (tokens)", ylabel=label)
            ax.grid(alpha=0.3)
        axes[0].legend()
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

    rows = report.merge([json.loads(Path(f).read_text()) for f in args.files])["rows"]
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in plot_eval(plt, rows, out_dir) + plot_needle(plt, rows, out_dir):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
