"""Serving load test: ``vllm bench serve`` against ``vllm serve`` for plain
decoding, vLLM's draft_model and draft_model + SpecExtend.

Per mode it starts ``vllm serve TARGET`` on a free local port, with the same
flags in every mode except the speculation ones (draft_model:
``--speculative-config``; spec_extend: the same plus ``--spec-extend``), waits
for ``/health``, sends one warm-up request, then runs ``vllm bench serve`` once
per concurrency on a ``custom`` dataset of long documents (PG-19, GovReport from
``../shared/data``, see ``benchmarks/prompts.py``) cut to ``--input-len`` tokens of
the tokenizer, and stops the server. Every run gets documents of its own, so
no run reuses the prefix cache of an earlier one.

    python -m benchmarks.bench_serve --target TARGET --draft DRAFT \\
        --input-len 8192 --output-len 128 --concurrency 1 4 16 --num-prompts 8 32 64 \\
        --out-dir benchmarks/results/serve/<stamp> -- --max-model-len 8448 ...

Arguments after ``--`` go to every ``vllm serve`` (``--load-format dummy``,
``--tensor-parallel-size``, ``--distributed-executor-backend``, ...). Writes to
``--out-dir``: ``results.json`` (metadata and one row per mode and concurrency:
vLLM's bench metrics, acceptance, and the deltas of the server's
``vllm:spec_decode_*`` / ``vllm:spec_extend_*`` counters over the run),
``summary.md`` (the table), the datasets, and the bench results and logs of
every run, and ``serve.png`` (``benchmarks.plot_serve``) where matplotlib
is installed (the ``bench`` extra). Rows of modes not run again are kept, so
modes can be run by separate invocations into one directory.

Servers get ``VLLM_LOG_STATS_INTERVAL=1`` unless it is set: SpecExtend's
counters reach ``/metrics`` once per interval while drafting, so they can lag
behind a run by up to that long. vLLM's spec-decode counters do not lag.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from benchmarks import prompts
from benchmarks.harness import modes
from benchmarks.harness.meta import run_metadata
from benchmarks.harness.server import scrape, serve, tail, vllm_command

VLLM = vllm_command()
MODES = modes.MODES[:3]
METRIC_PREFIXES = ("vllm:spec_decode_", "vllm:spec_extend_")


def counter_deltas(before: dict, after: dict) -> dict[str, float]:
    """Spec-decode and SpecExtend counters: growth from ``before`` to ``after``."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()
            if k.startswith(METRIC_PREFIXES) and k.endswith("_total")}


def document_prompts(tokenizer: str, datasets: list[str], input_len: int,
                     n: int) -> list[str]:
    """``n`` distinct texts of ``input_len`` tokens, taking the datasets in turn."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    per_dataset = -(-n // len(datasets))
    ids = {d: prompts.long_prompts(tok, input_len, per_dataset, dataset=d)
           for d in datasets}
    return [tok.decode(ids[datasets[i % len(datasets)]][i // len(datasets)])
            for i in range(n)]


def write_datasets(args) -> tuple[str, list[Path]]:
    """The warm-up prompt and one ``custom`` jsonl per concurrency."""
    texts = document_prompts(args.tokenizer, args.datasets, args.input_len,
                             1 + sum(args.num_prompts))
    paths, start = [], 1
    for c, n in zip(args.concurrency, args.num_prompts, strict=True):
        path = args.out_dir / "datasets" / f"c{c}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"prompt": t, "output_tokens": args.output_len}
                for t in texts[start:start + n]]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths.append(path)
        start += n
    return texts[0], paths


def serve_args(args, mode: str) -> list[str]:
    spec = modes.Speculation(draft=args.draft, num_spec_tokens=args.num_spec_tokens,
                             acceptance_length=args.acceptance_length,
                             spec_extend=json.loads(args.spec_extend))
    return [args.target, "--tokenizer", args.tokenizer, "--seed", str(args.seed),
            *modes.serve_flags(modes.engine_settings(mode, spec)), *args.serve_args]


def bench_command(args, base: str, dataset: Path, concurrency: int,
                  num_prompts: int, result: Path) -> list[str]:
    return [
        *VLLM, "bench", "serve", "--backend", "openai", "--base-url", base,
        "--model", args.target, "--tokenizer", args.tokenizer,
        "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--custom-output-len", "-1", "--skip-chat-template",
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--ignore-eos", "--temperature", "0", "--seed", str(args.seed),
        # /health already answered and warm_up ran; a ready check would send
        # the run's first prompt early and leave it in the prefix cache.
        "--ready-check-timeout-sec", "0", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--save-result", "--result-dir", str(result.parent),
        "--result-filename", result.name, *args.bench_arg,
    ]


def warm_up(base: str, model: str, prompt: str, timeout_s: float) -> None:
    """One long request (it also compiles what runs on first use, such as the
    scoring kernel), so that the first run does not pay for it."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 16,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        r.read()


def acceptance(bench: dict, delta: dict) -> tuple[float | None, float | None]:
    """(acceptance rate, mean acceptance length): vLLM bench's, else from the
    server's counters."""
    if "spec_decode_acceptance_rate" in bench:
        return (bench["spec_decode_acceptance_rate"] / 100,
                bench["spec_decode_acceptance_length"])
    drafted = delta.get("vllm:spec_decode_num_draft_tokens_total", 0)
    drafts = delta.get("vllm:spec_decode_num_drafts_total", 0)
    if not drafted or not drafts:
        return None, None
    accepted = delta.get("vllm:spec_decode_num_accepted_tokens_total", 0)
    return accepted / drafted, 1 + accepted / drafts


def run_mode(args, mode: str, warmup: str, datasets: list[Path]):
    """Yield one row per concurrency (or one error row if the server fails)."""
    logs = args.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        server = serve(serve_args(args, mode), logs / f"serve_{mode}.log",
                       args.startup_timeout)
        with server as srv:
            base, serve_cmd = srv.base, srv.command
            warm_up(base, args.target, warmup, args.run_timeout)
            runs = zip(args.concurrency, args.num_prompts, datasets, strict=True)
            for c, n, dataset in runs:
                result = args.out_dir / "bench" / f"{mode}_c{c}.json"
                cmd = bench_command(args, base, dataset, c, n, result)
                row = {"mode": mode, "concurrency": c, "num_prompts": n,
                       "serve_command": shlex.join(serve_cmd),
                       "bench_command": shlex.join(cmd)}
                before = scrape(base)
                log = logs / f"bench_{mode}_c{c}.log"
                with log.open("wb") as out:
                    try:
                        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL,
                                            timeout=args.run_timeout).returncode
                    except subprocess.TimeoutExpired:
                        rc = "timeout"
                delta = counter_deltas(before, scrape(base))
                if rc != 0 or not result.exists():
                    yield {**row, "error": f"vllm bench serve: {rc}\n{tail(log)}"}
                    continue
                bench = json.loads(result.read_text())
                rate, length = acceptance(bench, delta)
                yield {
                    **row,
                    # Scalars only: per-request lists stay in the bench file.
                    **{k: v for k, v in bench.items() if not isinstance(v, list)},
                    "errors": [e for e in bench.get("errors", []) if e][:5],
                    "acceptance_rate": rate,
                    "acceptance_length": length,
                    "server_metrics": delta,
                    "bench_result": str(result.relative_to(args.out_dir)),
                }
    except (RuntimeError, OSError) as e:
        yield {"mode": mode, "error": str(e)}


def _ms(row: dict, metric: str, stats=("mean", "p50", "p99")) -> str:
    return " / ".join(f"{row[f'{s}_{metric}_ms']:.0f}" for s in stats)


def table(result: dict) -> str:
    """Markdown table: one line per mode and concurrency."""
    lines = [
        "| mode | concurrency | completed / failed | output tok/s "
        "| TTFT ms mean / p50 / p99 | TPOT ms mean / p50 / p99 | ITL ms p50 / p99 "
        "| acceptance rate | acceptance length | draft context |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    order = {m: i for i, m in enumerate(MODES)}
    for r in sorted(result["runs"],
                    key=lambda r: (order.get(r["mode"], 9), r.get("concurrency", 0))):
        if "error" in r:
            first = r["error"].splitlines()[0]
            lines.append(f"| {r['mode']} | {r.get('concurrency', '–')} "
                         f"| error: {first} | | | | | | | |")
            continue
        m = r["server_metrics"]
        full = m.get("vllm:spec_extend_full_context_tokens_total", 0)
        share = (f"{100 * m['vllm:spec_extend_draft_context_tokens_total'] / full:.1f}%"
                 if full else "–")
        rate, length = ((f"{100 * r['acceptance_rate']:.1f}%",
                         f"{r['acceptance_length']:.2f}")
                        if r["acceptance_rate"] is not None else ("–", "–"))
        lines.append(
            f"| {r['mode']} | {r['concurrency']} | {r['completed']} / {r['failed']} "
            f"| {r['output_throughput']:.1f} | {_ms(r, 'ttft')} | {_ms(r, 'tpot')} "
            f"| {_ms(r, 'itl', ('p50', 'p99'))} | {rate} | {length} | {share} |"
        )
    meta, cfg = result["meta"], result["meta"]["config"]
    hw = meta["hardware"]
    device = (", ".join(hw["gpus"]) if hw["gpus"]
              else f"{hw['cpu']} ({hw['cpu_count']} CPUs)")
    synthetic = (f"synthetic acceptance length {cfg['acceptance_length']}"
                 if cfg["acceptance_length"] > 0 else "real acceptance")
    lines.append(
        f"\n{device}, vLLM {meta['vllm']}, torch {meta['torch']}, {meta['date_utc']}, "
        f"commit {(meta['git_commit'] or '?')[:7]}; {cfg['input_len']}-token inputs "
        f"({', '.join(cfg['datasets'])}), {cfg['output_len']} output tokens, "
        f"K={cfg['num_spec_tokens']}, {synthetic}."
    )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(
        description=" ".join(__doc__.split("\n\n")[0].split()),
        usage="%(prog)s [options] [-- VLLM_SERVE_ARGS...]")
    p.add_argument("--target", required=True, help="target model (dir or name)")
    p.add_argument("--draft", help="draft model; needed by the speculative modes")
    p.add_argument("--tokenizer", help="for the servers, the client and the "
                   "dataset (default: --target)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--num-prompts", nargs="+", type=int, default=[8, 32, 64],
                   help="requests per run: one number, or one per concurrency")
    p.add_argument("--input-len", type=int, default=8192,
                   help="prompt tokens (before the server adds BOS)")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--datasets", nargs="+", choices=prompts.DATASETS,
                   default=list(prompts.DATASETS))
    p.add_argument("--num-spec-tokens", type=int, default=4)
    p.add_argument("--acceptance-length", type=float, default=0.0,
                   help="synthetic mean acceptance length (random weights); "
                   "0: real rejection sampling")
    p.add_argument("--spec-extend", default='{"top_k": 32, "recent_tokens": 256}',
                   metavar="JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--run-timeout", type=float, default=1800.0,
                   help="seconds for each bench run (and the warm-up request)")
    p.add_argument("--bench-arg", action="append", default=[],
                   help="extra argument for vllm bench serve (repeatable), "
                   "e.g. --bench-arg=--request-rate=4")
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args(argv)
    args.serve_args = serve_extra
    args.tokenizer = args.tokenizer or args.target
    if len(args.num_prompts) == 1:
        args.num_prompts *= len(args.concurrency)
    if len(args.num_prompts) != len(args.concurrency):
        p.error("--num-prompts needs one number or one per --concurrency")
    if args.draft is None and set(args.modes) - {"plain"}:
        p.error("--draft is needed by the draft_model and spec_extend modes")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the running server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "results.json"
    runs = []
    if out.exists():
        runs = [r for r in json.loads(out.read_text())["runs"]
                if r["mode"] not in args.modes]
    result = {"meta": run_metadata(args), "runs": runs}
    warmup, datasets = write_datasets(args)
    for mode in args.modes:
        for row in run_mode(args, mode, warmup, datasets):
            print(json.dumps({k: v for k, v in row.items()  # noqa: T201
                              if not k.endswith("_command")}), flush=True)
            result["runs"].append(row)
            out.write_text(json.dumps(result, indent=1))
    summary = table(result)
    (args.out_dir / "summary.md").write_text(summary + "\n")
    print(summary)  # noqa: T201
    if importlib.util.find_spec("matplotlib"):
        from benchmarks.plot_serve import plot

        plot(result, args.out_dir / "serve.png")
    bad = [r for r in result["runs"] if r["mode"] in args.modes and (
        "error" in r or r["failed"] or r["completed"] != r["num_prompts"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
