"""Output tokens/s and TPOT against concurrency, one line per mode, from a
``bench_serve.py`` result. Needs matplotlib (the ``bench`` extra);
``bench_serve.py`` calls it itself where matplotlib is installed.

    python -m benchmarks.plot_serve DIR/results.json [--out DIR/serve.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.harness.meta import device as device_name
from benchmarks.harness.modes import MODES


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput, tpot) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for mode in MODES:
        rows = sorted((r for r in result["runs"]
                       if r["mode"] == mode and "error" not in r),
                      key=lambda r: r["concurrency"])
        if not rows:
            continue
        x = [r["concurrency"] for r in rows]
        tput.plot(x, [r["output_throughput"] for r in rows], "o-", label=mode)
        (line,) = tpot.plot(x, [r["median_tpot_ms"] for r in rows], "o-",
                            label=f"{mode} p50")
        tpot.plot(x, [r["p99_tpot_ms"] for r in rows], "x--", color=line.get_color(),
                  alpha=0.6, label=f"{mode} p99")
    for ax, ylabel in ((tput, "output tokens/s"), (tpot, "TPOT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(result["meta"]["config"]["concurrency"],
                      labels=map(str, result["meta"]["config"]["concurrency"]))
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    meta, cfg = result["meta"], result["meta"]["config"]
    device = device_name(meta)
    fig.suptitle(f"{Path(cfg['target']).name} / {Path(cfg['draft'] or '-').name}, "
                 f"{cfg['input_len']}-token inputs, {cfg['output_len']} output tokens; "
                 f"{device}, vLLM {meta['vllm']}", fontsize=10)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path, help="default: serve.png beside RESULTS")
    args = parser.parse_args()
    out = args.out or args.results.with_name("serve.png")
    plot(json.loads(args.results.read_text()), out)
    print(out)  # noqa: T201


if __name__ == "__main__":
    main()
