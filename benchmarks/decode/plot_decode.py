"""Decode tokens/s against context, one panel per batch size, from one or more
``benchmarks.decode.bench_decode`` result files: a colour per mode, a line style per
file, error bars from a cell's runs (min to max around the median). Needs
matplotlib (the ``bench`` extra).

    python -m benchmarks.decode.plot_decode RUN1.json [RUN2.json ...] --out decode.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.harness.meta import device

STYLES = ["o-", "s--", "^:", "d-."]


def _spread(row: dict) -> tuple[float, float, float]:
    """(median, min, max) decode tok/s of a row (older files: one run)."""
    tok = row["decode_tok_s"]
    if isinstance(tok, dict):
        return tok["median"], tok["min"], tok["max"]
    return tok, tok, tok


def file_tags(files: list[Path], devices: list[str]) -> list[str]:
    """Each file's label: its device where the files come from different hosts
    (their figures are then no comparison), else its name's last part."""
    if len(set(devices)) > 1:
        return devices
    return [f.stem.rsplit("_", 1)[-1] for f in files]


def plot(files: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [json.loads(f.read_text()) for f in files]
    for res in results:
        res["results"] = [r for r in res["results"] if "skipped" not in r]
    batches = sorted({r["batch"] for res in results for r in res["results"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(max(8.0, 5.5 * len(batches)), 4),
                             constrained_layout=True, squeeze=False)
    devices = [device(res["meta"]) for res in results]
    tags = file_tags(files, devices)
    colors = {}
    for tag, res, style in zip(tags, results, STYLES[:len(files)], strict=True):
        modes = dict.fromkeys(r["mode"] for r in res["results"])
        for ax, batch in zip(axes[0], batches, strict=True):
            for mode in modes:
                rows = sorted((r for r in res["results"]
                               if r["mode"] == mode and r["batch"] == batch),
                              key=lambda r: r["context"])
                if not rows:
                    continue
                color = colors.setdefault(mode, f"C{len(colors)}")
                mid, low, high = zip(*map(_spread, rows), strict=True)
                ax.errorbar([r["context"] // 1024 for r in rows], mid,
                            yerr=[[m - lo for m, lo in zip(mid, low, strict=True)],
                                  [h - m for m, h in zip(mid, high, strict=True)]],
                            fmt=style, capsize=3, color=color,
                            label=f"{mode} ({tag})" if len(files) > 1 else mode)
    for ax, batch in zip(axes[0], batches, strict=True):
        ax.set_title(f"batch {batch}", fontsize=10)
        ax.set_xlabel("context (K tokens)")
        ax.set_ylabel("decode tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    meta, cfg = results[0]["meta"], results[0]["meta"]["config"]
    fig.suptitle(f"{Path(cfg['target_config']).name} / "
                 f"{', '.join(Path(d).name for d in cfg['draft_config'])}; "
                 f"{devices[0] if len(set(devices)) == 1 else 'several hosts'}, "
                 f"vLLM {meta['vllm']}, "
                 f"synthetic acceptance length {cfg['acceptance_length']}", fontsize=10)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    plot(args.files, args.out)
    print(args.out)  # noqa: T201


if __name__ == "__main__":
    main()
