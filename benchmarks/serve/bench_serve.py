"""Serving load test: ``vllm bench serve`` against one ``vllm serve`` per mode
(plain, vLLM's speculation, SpecExtend, self_draft), started one after another
with the same flags but the speculation ones, on workloads where decoding is
the work, and one where prefill is. ``--method`` is vLLM's speculation method
under the draft_model and spec_extend modes (draft_model, eagle, eagle3 with
``--draft`` an EAGLE head); rows of vLLM's speculation alone are named after it
(``benchmarks.harness.modes.label``), so eagle3 rows say eagle3.

Workloads, each at every ``--input-lens`` and ``--concurrency``:

* ``long``: long inputs, long outputs (``--long-output-len``, 1,024), every
  request its own document;
* ``shared-doc``: one document, many questions: the run's requests share one
  document and differ in a short question at its end (``--doc-output-len``,
  512). A one-token request primes the prefix cache first, so the document's
  prefill is paid once and decoding dominates (document QA, agent loops);
* ``short``: the prefill-bound reference (``--short-output-len``, 128), every
  request its own document;
* ``mixed``: long outputs (``--long-output-len``) for requests alternating a
  short input (``--mixed-short-len``, 1,024) and a long one (the input length),
  every request its own document: both kinds are in flight together, so a mode
  that pays off only on long contexts shows what the short part of a batch
  costs it. Its rows' ``input_len`` is the long length, ``short_input_len``
  the short one.

Prompts are documents of PG-19 and GovReport (``../shared/data``,
``benchmarks.prompts``) cut to the input length with the tokenizer; outputs
have exactly their length (``ignore_eos``). Every run gets documents of its
own, the same ones in every mode, so no run reuses an earlier run's cache.
Each server gets one warm-up request, then ``--runs`` runs per (workload,
input length, concurrency).

Traffic: by default bursts, ``--concurrency`` requests at once (vLLM bench's
``--max-concurrency``), ``--num-prompts`` per run. With ``--request-rates``
instead: Poisson arrivals at each rate (vLLM bench's ``--request-rate``; with
its ``--seed``, every run and mode gets the same arrival times, scaled to the
rate), no cap on the requests in flight, ``--num-prompts`` (32) per run, so a
run's arrivals last num_prompts / rate seconds; ``--load`` labels each rate
(``low``, ``high``). ``--goodput ttft:MS tpot:MS`` (vLLM bench's SLOs, in
milliseconds, per request; ``e2el`` too) makes each run count its goodput, the
completed requests per second that met them all. A rate's rows carry
``request_rate``, ``load`` and ``goodput_slo``; its table gives, per series,
the rate at which ``--target-in-flight`` (16) requests would be in flight
(``next_rate``, Little's law from the table's rates), the rate to run next,
capped as ``--find-rate`` caps its probes where a run of the series was
overloaded, and marked where it reaches past twice every rate run.
``--find-rate RATE`` finds the rates itself: the first mode's server runs
``--probes`` probe runs (one run each, documents of their own), the first at
RATE and each next one at ``next_rate`` of those before, at most
``CAPACITY_SHARE`` (90%) of the completed requests per second of a probe that
ran past the server's capacity (its later requests' first tokens came over
``QUEUE_GROWTH`` times later than its earlier ones'); the table then runs
every mode at the rate so found (``high``) and at half of it (``low``), high
first (``--load`` picks one, or the order). The probes are kept under
``probes`` in the results, outside the table's rows.

Each run is a ``vllm bench serve`` run, its arguments those of the command
that results record, run in one warm client process
(``benchmarks.serve.bench_client``: the command's 23 s of imports once, not per
run). Per run, from ``vllm bench serve --save-result --save-detailed``: output
tok/s, TTFT, TPOT and ITL (p50 / p90 / p99), completed and failed requests,
goodput (``request_goodput``, None without ``--goodput``), the mean requests
in flight (``in_flight``: each completed request's start to last token,
summed, over the time from the first start to the last end;
``harness.measure.mean_in_flight``), and the decode-phase throughput (output
tokens after each request's first token over the time after the first tokens,
``benchmarks.harness.measure``, from the per-request start times, TTFTs and
ITLs) and where its window goes
(``burst_shape``: the spread of the first tokens, the last first token's
request's decode time) and the tokens per streamed chunk (``tokens_per_chunk``:
above the mode's tokens per step, the API server fell behind the engine); the
GPU busy share over that same decode phase (``gpu_busy``: NVML's
``utilization.gpu`` of device 0, sampled here while the client runs, stamped
with the client's clock ``time.perf_counter``, ``benchmarks.harness.gpu_busy``;
None without NVML);
from ``/metrics``: acceptance, the deltas of the ``vllm:spec_decode_*`` /
``vllm:spec_extend_*`` counters and the names of every ``vllm:spec_extend_*``
series the server exports (``spec_extend_series``); a digest of the generated
texts (equal across modes with real rejection sampling). Per cell: min /
median / max over the runs. Per server: its command, start-up time, whether
vLLM turned async scheduling on (its log line), and whether it stopped
cleanly.

    python -m benchmarks.serve.bench_serve --target TARGET --draft DRAFT \\
        --workloads long shared-doc --input-lens 16384 32768 --concurrency 1 4 16 32 \\
        --out-dir benchmarks/results/serve/<stamp> -- --max-model-len 33792 ...
    python -m benchmarks.serve.bench_serve --target TARGET --draft DRAFT \\
        --workloads long --input-lens 16384 --request-rates 0.25 0.5 --load low high \\
        --goodput ttft:20000 tpot:50 --out-dir ... -- --max-model-len 17664 ...

Arguments after ``--`` go to every ``vllm serve`` (``--load-format dummy``,
``--max-num-seqs``, ``--async-scheduling``, ...). Writes to ``--out-dir``:
``results.json`` (metadata, ``servers``, and a row per workload, input length,
mode and concurrency or rate with its runs), ``summary.md`` (the tables),
``serve_<workload>_<input len>.png`` (``serve_rate_...``: at the rates;
``benchmarks.serve.plot_serve``, where matplotlib is installed), the datasets, and
every run's bench result and log.
Servers get ``VLLM_LOG_STATS_INTERVAL=1`` unless it is set: SpecExtend's
counters reach ``/metrics`` once per interval while drafting.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import itertools
import json
import re
import shlex
import signal
import statistics
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks import prompts
from benchmarks.harness import modes
from benchmarks.harness.gpu_busy import GpuBusy
from benchmarks.harness.measure import (
    QUEUE_GROWTH,
    burst_shape,
    decode_throughput,
    mean_in_flight,
    spread,
    ttft_growth,
)
from benchmarks.harness.meta import (
    SPEED_SPEC_EXTEND,
    device,
    plugin_env,
    run_metadata,
    vllm_kernel_env,
)
from benchmarks.harness.server import (
    log_errors,
    scrape,
    serve,
    serve_args_parser,
    tail,
    tokenizer_gap,
    vllm_command,
)
from benchmarks.serve.bench_client import BenchClient
from benchmarks.serve.series import inputs, rated, series, series_key

WORKLOADS = ("long", "shared-doc", "short", "mixed")
METRIC_PREFIXES = ("vllm:spec_decode_", "vllm:spec_extend_")
QUESTIONS = (
    "Summarize the text above in three sentences.",
    "Who are the main people or organisations in the text above?",
    "List the five most important facts stated above.",
    "What happens at the end of the text above?",
    "Which places are named in the text above?",
    "Write a title for the text above and explain it.",
    "What problem does the text above describe, and what solution?",
    "Quote the sentence above that matters most, and say why.",
)
# Per-run figures summarized per cell: (row key, bench result key).
FIGURES = (
    ("output_tok_s", "output_throughput"), ("decode_tok_s", "decode_tok_s"),
    ("ttft_p50_ms", "median_ttft_ms"), ("ttft_p90_ms", "p90_ttft_ms"),
    ("ttft_p99_ms", "p99_ttft_ms"),
    ("tpot_p50_ms", "median_tpot_ms"), ("tpot_p90_ms", "p90_tpot_ms"),
    ("tpot_p99_ms", "p99_tpot_ms"),
    ("itl_p50_ms", "median_itl_ms"), ("itl_p90_ms", "p90_itl_ms"),
    ("itl_p99_ms", "p99_itl_ms"),
    ("first_token_spread_s", "first_token_spread_s"),
    ("last_request_decode_s", "last_request_decode_s"),
    ("in_flight", "in_flight"),
)
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
"""The SLOs ``vllm bench serve --goodput`` knows."""
LOADS = ("low", "high")


@dataclass
class Traffic:
    """How one cell's requests arrive: ``concurrency`` at once (a burst), or
    at ``request_rate`` per second (Poisson), labelled ``load``."""
    concurrency: int | None
    num_prompts: int
    request_rate: float | None = None
    load: str | None = None

    @property
    def tag(self) -> str:
        """In file names: c4, r2.5."""
        if self.request_rate is None:
            return f"c{self.concurrency}"
        return f"r{self.request_rate:g}"


@dataclass
class Cell:
    workload: str
    input_len: int
    concurrency: int
    num_prompts: int
    output_len: int
    datasets: list[Path]
    """One custom-dataset jsonl per run."""
    primes: list[str | None]
    """Per run: the shared document to cache before the run (shared-doc)."""
    short_len: int | None = None
    """mixed: the short inputs' length (``input_len`` is the long one's)."""
    request_rate: float | None = None
    """Requests per second (Poisson arrivals); None: a burst of ``concurrency``."""
    load: str | None = None
    """The rate's label (``LOADS``)."""

    @property
    def traffic(self) -> Traffic:
        return Traffic(self.concurrency, self.num_prompts, self.request_rate,
                       self.load)


def counter_deltas(before: dict, after: dict) -> dict[str, float]:
    """Spec-decode and SpecExtend counters: growth from ``before`` to ``after``."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()
            if k.startswith(METRIC_PREFIXES) and k.endswith("_total")}


def document_prompts(tokenizer: str, datasets: list[str],
                     lengths: list[int]) -> list[str]:
    """A distinct text per length, of that many tokens, taking the datasets in
    turn. One call for texts of several lengths: each is its own document, so
    a short text is never the start of a long one (a prefix-cache hit)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    ids = {d: prompts.long_prompts(tok, lengths[i::len(datasets)], dataset=d)
           for i, d in enumerate(datasets)}
    return [tok.decode(ids[datasets[i % len(datasets)]][i // len(datasets)])
            for i in range(len(lengths))]


def output_len(args, workload: str) -> int:
    return {"long": args.long_output_len, "shared-doc": args.doc_output_len,
            "short": args.short_output_len, "mixed": args.long_output_len}[workload]


def document_lens(args, workload: str, input_len: int, n: int) -> list[int]:
    """Token counts of the documents one run of ``n`` requests takes:
    shared-doc's one; mixed's alternate short and long, so that any
    concurrency above 1 keeps both kinds in flight."""
    if workload == "shared-doc":
        return [input_len]
    if workload == "mixed":
        return [(args.mixed_short_len, input_len)[i % 2] for i in range(n)]
    return [input_len] * n


def run_prompts(workload: str, docs: list[str], n: int) -> tuple[list[str], str | None]:
    """A run's ``n`` prompts from its documents, and the document to cache
    before the run: shared-doc asks ``n`` questions about its one document."""
    if workload != "shared-doc":
        return docs, None
    doc = docs[0]
    return [f"{doc}\n\nQuestion {i + 1}: {QUESTIONS[i % len(QUESTIONS)]}"
            for i in range(n)], doc


def write_dataset(path: Path, texts: list[str], out_len: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": t, "output_tokens": out_len}) + "\n"
                            for t in texts))
    return path


def plan(args) -> tuple[dict[int, str], list[Cell]]:
    """The warm-up prompt per input length and every cell with its datasets."""
    warmups, cells = {}, []
    root = args.out_dir / "datasets"
    runs = [(w, t, run) for w in args.workloads for t in traffics(args)
            for run in range(args.runs)]
    if args.find_rate is not None:
        # The probes' own documents, one run each: no run reuses a probe's cache.
        # As many requests as the high load's runs (the rate it finds).
        n = args.num_prompts[args.load.index("high") if "high" in args.load else 0]
        probe = Traffic(None, n, args.find_rate, "probe")
        runs = [(args.workloads[0], probe, i) for i in range(args.probes)] + runs
    for input_len in args.input_lens:
        lens = [document_lens(args, w, input_len, t.num_prompts) for w, t, _ in runs]
        # All documents of this input length from one call, in the order the
        # runs take them: none is cut from another's document.
        texts = iter(document_prompts(args.tokenizer, args.datasets,
                                      [input_len, *itertools.chain(*lens)]))
        warmups[input_len] = next(texts)
        here: dict[tuple[str, str, str | None], Cell] = {}
        for (workload, t, run), run_lens in zip(runs, lens, strict=True):
            if (workload, t.tag, t.load) not in here:
                short = args.mixed_short_len if workload == "mixed" else None
                here[workload, t.tag, t.load] = Cell(
                    workload, input_len, t.concurrency, t.num_prompts,
                    output_len(args, workload), [], [], short, t.request_rate, t.load)
            cell = here[workload, t.tag, t.load]
            rows, prime = run_prompts(workload, [next(texts) for _ in run_lens],
                                      t.num_prompts)
            # --find-rate's rates are known only once the probes ran: its
            # datasets are named by their load ("probe", "high", "low").
            name = t.load if args.find_rate is not None else t.tag
            path = root / f"{workload}_{input_len}_{name}_run{run}.jsonl"
            cell.datasets.append(write_dataset(path, rows, cell.output_len))
            cell.primes.append(prime)
        cells += here.values()
    return warmups, cells


def error_cell(error: str) -> str:
    """A server's error in one table cell: its first line and, where that
    only introduces them ("vllm serve exited (2):"), the first cause below."""
    lines = [ln.strip() for ln in error.splitlines() if ln.strip()]
    head = lines[0] if lines else ""
    cause = lines[1] if len(lines) > 1 else "last lines of"
    if head.endswith(":") and not cause.startswith("last lines of"):
        head += " " + cause
    return head.replace("|", "\\|")


def goodput_slo(args) -> dict[str, float] | None:
    """``--goodput``'s SLOs: {"ttft": ms, "tpot": ms, ...}; None without."""
    if not args.goodput:
        return None
    return {name: float(ms) for name, ms in (slo.split(":") for slo in args.goodput)}


def speculation(args) -> modes.Speculation:
    return modes.Speculation(draft=args.draft, method=args.method,
                             num_spec_tokens=args.num_spec_tokens,
                             acceptance_length=args.acceptance_length,
                             spec_extend=json.loads(args.spec_extend))


def label(args, mode: str) -> str:
    """The mode's name in rows, servers and file names (eagle3, not draft_model)."""
    return modes.label(mode, speculation(args))


def names(args, mode: str) -> dict:
    """What rows and servers say of a mode's engine: its label, and vLLM's
    method and the draft where it has a draft model."""
    drafted = modes.needs_draft(mode)
    return {"mode": label(args, mode), "method": args.method if drafted else None,
            "draft": Path(args.draft).name if drafted else None}


def serve_args(args, mode: str) -> list[str]:
    settings = modes.engine_settings(mode, speculation(args))
    return [args.target, "--tokenizer", args.tokenizer, "--seed", str(args.seed),
            *modes.serve_flags(settings), *args.serve_args]


def traffic_flags(args, traffic: Traffic) -> list[str]:
    """vllm bench serve's flags for how requests arrive, and the SLOs."""
    if traffic.request_rate is None:
        flags = ["--max-concurrency", str(traffic.concurrency)]
    else:
        flags = ["--request-rate", str(traffic.request_rate)]
    return flags + (["--goodput", *args.goodput] if args.goodput else [])


def bench_command(args, base: str, dataset: Path, traffic: Traffic,
                  result: Path) -> list[str]:
    return [
        *vllm_command(), "bench", "serve", "--backend", "openai", "--base-url", base,
        "--model", args.target, "--tokenizer", args.tokenizer,
        "--dataset-name", "custom", "--dataset-path", str(dataset),
        "--custom-output-len", "-1", "--skip-chat-template",
        "--num-prompts", str(traffic.num_prompts), *traffic_flags(args, traffic),
        "--ignore-eos", "--temperature", "0", "--seed", str(args.seed),
        # /health already answered and warm_up ran; a ready check would send
        # the run's first prompt early and leave it in the prefix cache.
        "--ready-check-timeout-sec", "0", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99",
        "--save-result", "--save-detailed", "--result-dir", str(result.parent),
        "--result-filename", result.name, *args.bench_arg,
    ]


def complete(base: str, model: str, prompt: str, max_tokens: int,
             timeout_s: float) -> None:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
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


def request_spans(bench: dict) -> list[tuple[float, float, int]]:
    """(first token, last token, output tokens) of each request that produced
    tokens, from the per-request data of ``--save-detailed`` (start time, TTFT
    and ITLs), in the client's ``time.perf_counter`` seconds."""
    return [(start + ttft, start + ttft + sum(itls), n)
            for start, ttft, itls, n, error in zip(
                bench["start_times"], bench["ttfts"], bench["itls"],
                bench["output_lens"], bench["errors"], strict=True)
            if not error and n]


def in_flight(bench: dict) -> float | None:
    """Mean requests in flight (``measure.mean_in_flight``) over the requests
    that completed, each from its start to its last token (vLLM bench's
    latency: the TTFT and the ITLs after it), from ``--save-detailed``'s
    per-request data; a failed request's end is unknown and not counted."""
    return mean_in_flight((start, start + ttft + sum(itls))
                          for start, ttft, itls, error in zip(
                              bench["start_times"], bench["ttfts"], bench["itls"],
                              bench["errors"], strict=True)
                          if not error)


def queue_growth(bench: dict) -> float | None:
    """``measure.ttft_growth`` over the requests that did not fail, from
    ``--save-detailed``'s per-request data: about 1 where the server kept
    up, over ``QUEUE_GROWTH`` where its queue grew all run long."""
    ok = [(start, ttft) for start, ttft, error in zip(
        bench["start_times"], bench["ttfts"], bench["errors"], strict=True) if not error]
    return ttft_growth([s for s, _ in ok], [t for _, t in ok])


def next_rate(probes: list[tuple[float, float]], target: float = 16.0) -> float | None:
    """The request rate to run next for ``target`` requests in flight, from
    measured (request rate, mean in flight) probes of one server and workload.
    Little's law: in flight = rate x mean latency. One probe: its latency
    held, rate x target / in flight. Latency grows with the load, so in
    flight grows faster than the rate: from a probe below the target that
    overshoots, from one above it undershoots. Two probes or more: the line
    through the two nearest the target (in flight); beyond both, going up no
    further than Little's law from the nearer (the line overshoots less, but
    noise can flatten it), going down no lower (the rate lies between them);
    Little's law alone where the line does not rise. None without a probe
    that had requests in flight."""
    probes = sorted(((r, n) for r, n in probes if r and n),
                    key=lambda probe: abs(probe[1] - target))
    if not probes:
        return None
    (r1, n1), *rest = probes
    little = r1 * target / n1
    if not rest or rest[0][0] == r1 or (n1 - rest[0][1]) / (r1 - rest[0][0]) <= 0:
        return little
    r2, n2 = rest[0]
    line = r1 + (target - n1) * (r1 - r2) / (n1 - n2)
    if target > max(n1, n2):
        return min(line, little)
    if target < min(n1, n2):
        return max(line, little)
    return line


# The highest rate found: this share of the capacity that a probe past it
# measured (its completed requests per second). Past the capacity a probe's
# queue grows all run long (``measure.ttft_growth`` over QUEUE_GROWTH), and a
# finite run's mean in flight still grows with the rate (H200, 8B, 32K/512,
# 32 requests: 24 in flight at 1.63 req/s, which completed 0.535; the line
# through it proposed 1.14, twice the capacity, 2026-11-28). Its completed
# requests per second are the capacity then (the 1.14 runs: 0.531-0.534).
CAPACITY_SHARE = 0.9


def overload_capacity(runs: list[dict]) -> float | None:
    """The most completed requests per second among ``runs`` whose queue
    grew all run long (``ttft_growth`` over ``QUEUE_GROWTH``): the server's
    capacity; None where none was overloaded."""
    return max((run["request_throughput"] for run in runs
                if (run.get("ttft_growth") or 0) > QUEUE_GROWTH
                and run.get("request_throughput")), default=None)


def find_rate(probe, first: float, probes: int, target: float = 16.0,
              ) -> tuple[float | None, list[tuple[float, float | None]], float | None]:
    """The request rate for ``target`` requests in flight, from ``probes``
    probe runs: ``probe(rate)`` runs one and returns its run (``in_flight``,
    None where it had none, e.g. every request failed; ``ttft_growth``;
    ``request_throughput``, completed requests per second); the first at
    ``first``, each next one at ``next_rate`` of those before, capped at
    ``CAPACITY_SHARE`` of the capacity a probe whose queue grew measured
    (``measure.QUEUE_GROWTH``). Returns that rate
    over every probe (None without a usable one), the probes (rate, in
    flight) and the capacity (None where no probe was overloaded)."""
    done: list[tuple[float, float | None]] = []
    runs: list[dict] = []
    capacity = None
    rate = first
    for _ in range(probes):
        run = probe(rate)
        done.append((rate, run.get("in_flight")))
        runs.append(run)
        capacity = overload_capacity(runs)
        rate = next_rate([(r, n) for r, n in done if n], target)
        if rate is None:
            break
        if capacity is not None:
            rate = min(rate, CAPACITY_SHARE * capacity)
    return rate, done, capacity


def tokens_per_chunk(bench: dict) -> float | None:
    """Median over the requests that produced tokens of output tokens per
    streamed chunk. An API server that keeps up sends one chunk per engine
    step (1 token for plain decoding, about the acceptance length under
    speculation); more means it fell behind and merged steps, and then the
    client's ITL and decode figures time the server, not the engine (seen
    2026-11-27 with a tokenizer that lacked ids the model emitted)."""
    ratios = [n / (1 + len(itls))
              for itls, n, error in zip(bench["itls"], bench["output_lens"],
                                        bench["errors"], strict=True)
              if not error and n]
    return statistics.median(ratios) if ratios else None


def stream_figures(bench: dict, requests: list[tuple[float, float, int]]) -> dict:
    """What a run's per-request records tell without the GPU: decode
    throughput, where its window goes and the tokens per streamed chunk
    (``requests``: the run's ``request_spans``)."""
    return {**decode_throughput(requests), **burst_shape(requests),
            "tokens_per_chunk": tokens_per_chunk(bench)}


def decode_phase(bench: dict, busy: GpuBusy) -> dict:
    """``stream_figures`` and the GPU busy share over each request's [first
    token, last token] (``request_spans``: the clock ``busy`` must stamp its
    samples with)."""
    requests = request_spans(bench)
    return {**stream_figures(bench, requests),
            "gpu_busy": busy.share((first, last) for first, last, _ in requests)}


def run_figures(bench: dict, delta: dict, busy: GpuBusy) -> dict:
    rate, length = acceptance(bench, delta)
    texts = bench.get("generated_texts") or []
    return {
        # Scalars only: per-request lists stay in the bench file.
        **{k: v for k, v in bench.items() if not isinstance(v, (list, dict))},
        **decode_phase(bench, busy),
        "in_flight": in_flight(bench),
        "ttft_growth": queue_growth(bench),
        "errors": [e for e in bench.get("errors", []) if e][:5],
        "acceptance_rate": rate,
        "acceptance_length": length,
        "output_sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest(),
        "server_metrics": delta,
    }


def run_cell(args, client: BenchClient, base: str, mode: str, cell: Cell,
             logs: Path) -> list[dict]:
    runs = []
    for i, (dataset, prime) in enumerate(zip(cell.datasets, cell.primes, strict=True)):
        tag = (f"{label(args, mode)}_{cell.workload}_{cell.input_len}"
               f"_{cell.traffic.tag}_run{i}")
        if cell.load == "probe":  # one dataset a probe, named apart
            tag = f"{label(args, mode)}_{dataset.stem}"
        result = args.out_dir / "bench" / f"{tag}.json"
        cmd = bench_command(args, base, dataset, cell.traffic, result)
        argv = cmd[cmd.index("serve") + 1:]  # what `vllm bench serve` parses
        if prime is not None:
            complete(base, args.target, prime, 1, args.run_timeout)
        before = scrape(base)
        log = logs / f"bench_{tag}.log"
        # NVML is device-wide: sampling from here sees the server's kernels.
        with GpuBusy(clock=time.perf_counter) as busy:
            rc = client.run(argv, log, args.run_timeout)
        after = scrape(base)
        delta = counter_deltas(before, after)
        run = {"bench_command": shlex.join(cmd),
               "bench_result": str(result.relative_to(args.out_dir)),
               # Every SpecExtend series the server exports, gauges too
               # (none where the plugin is installed but not enabled).
               "spec_extend_series": sorted(k for k in after
                                            if k.startswith("vllm:spec_extend_"))}
        if rc != 0 or not result.exists():
            runs.append({**run, "error": f"vllm bench serve: {rc}\n{tail(log)}"})
            continue
        runs.append({**run, **run_figures(json.loads(result.read_text()), delta,
                                          busy)})
    return runs


def cell_row(args, mode: str, cell: Cell, runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    row = {"workload": cell.workload, "input_len": cell.input_len,
           "short_input_len": cell.short_len, "output_len": cell.output_len,
           **names(args, mode),
           "concurrency": cell.concurrency, "num_prompts": cell.num_prompts,
           **({} if cell.request_rate is None else {
               "request_rate": cell.request_rate, "load": cell.load,
               "goodput_slo": goodput_slo(args)}),
           "runs": runs,
           "failed_requests": sum(r.get("failed", 0) for r in ok),
           "failed_runs": len(runs) - len(ok)}
    for key, source in (*FIGURES, ("goodput", "request_goodput")):
        row[key] = spread([r[source] for r in ok if r.get(source) is not None])
    lengths = [r["acceptance_length"] for r in ok if r["acceptance_length"]]
    row["acceptance_length"] = spread(lengths)["median"]
    return row


def async_scheduling(log: Path) -> bool | None:
    """What vLLM decided, from its log: the last such line, the engine core's
    (the API server logs its own first, before the platform may turn it off)."""
    found = re.findall(r"Asynchronous scheduling is (enabled|disabled)",
                       log.read_text(errors="replace"))
    return found[-1] == "enabled" if found else None


def jit_after_start(log: Path) -> list[str]:
    """Kernels vLLM's JIT monitor saw compile after the server said it was
    starting (``Starting vLLM server``), in order: each compiled inside the
    first requests (here the bench's warm-up prompts), a latency spike a
    user's first request pays. Empty where no monitor runs (CPU). The monitor
    warns once per kernel name: a kernel compiled again later (Triton
    specialises an int argument that is 1, or a multiple of 16) shows only
    under the server flag ``--jit-monitor-verbose``, once per compile and
    tensor-parallel rank: a kernel counts as often as the rank that logged
    it most."""
    text = log.read_text(errors="replace")
    start = text.find("Starting vLLM server")
    if start < 0:
        return []
    ranks: dict[str, Counter] = {}  # the line's process, "(Worker_TP1 pid=7)"
    for rank, name in re.findall(r"^(\([^)]*\))?.*JIT compilation during "
                                 r"inference: (\w+)", text[start:], re.M):
        ranks.setdefault(rank, Counter())[name] += 1
    counts = Counter()
    for compiles in ranks.values():
        counts |= compiles  # a kernel: the most compiles of one rank
    return list(counts.elements())


def compiled(kernels: list[str]) -> str:
    """``jit_after_start``'s names for a table cell, in order of their first
    compile, ``×N`` for one compiled N times (``--jit-monitor-verbose``)."""
    return ", ".join(name if n == 1 else f"{name} ×{n}"
                     for name, n in Counter(kernels).items())


def resolved_prompt_pool(log: Path) -> int | None:
    """What ``draft_prompt_pool`` became on the server's engine (``"auto"``
    resolved), from the worker's "SpecExtend enabled" line: the
    pool's chunks, or None (the draft's full pass, or a server without the
    plugin)."""
    found = re.findall(r"SpecExtend enabled: SpecExtendConfig\(.*?"
                       r"draft_prompt_pool=(\d+|None)", log.read_text(errors="replace"))
    return int(found[-1]) if found and found[-1] != "None" else None


def probe_rates(args, client: BenchClient, base: str, mode: str, cell: Cell,
                logs: Path, probes: dict) -> None:
    """``--find-rate``: the probe runs on this server (``find_rate``), one
    of ``cell``'s datasets each, into ``probes`` as they end (``runs``),
    then the rate found (``high_rate``, None until found: a probe that
    raised leaves it None, and no mode runs the table)."""
    runs = probes["runs"]

    def probe(rate: float) -> dict:
        i = len(runs)
        one = dataclasses.replace(cell, datasets=[cell.datasets[i]],
                                  primes=[cell.primes[i]], request_rate=rate)
        run = run_cell(args, client, base, mode, one, logs)[0]
        runs.append({"request_rate": rate, **run})
        print(json.dumps({"probe": i, "request_rate": rate,  # noqa: T201
                          "in_flight": run.get("in_flight"),
                          "ttft_growth": run.get("ttft_growth"),
                          "request_throughput": run.get("request_throughput")}),
              flush=True)
        return run

    probes["high_rate"], _, probes["capacity"] = find_rate(
        probe, args.find_rate, args.probes, args.target_in_flight)


def set_rates(cells: list[Cell], result: dict) -> None:
    """The found rate (``result["probes"]``) to the table's cells (``high``;
    ``low`` half of it) and into the results; none found: the table cannot run."""
    high = result["probes"]["high_rate"]
    if high is None:
        raise RuntimeError("--find-rate: no probe had a request in flight "
                           "(see the probe runs' errors in results.json)")
    high = float(f"{high:.3g}")
    for cell in cells:
        cell.request_rate = high if cell.load == "high" else float(f"{high / 2:.3g}")
    result["meta"]["config"]["request_rates"] = sorted({c.request_rate for c in cells})


def run_mode(args, client: BenchClient, mode: str, warmups: dict[int, str],
             cells: list[Cell], result: dict, out: Path) -> None:
    """Start the mode's server, run every cell, record as it goes."""
    logs = args.out_dir / "logs"
    log = logs / f"serve_{label(args, mode)}.log"
    record = {**names(args, mode), "plugin_env": plugin_env(),
              "vllm_env": vllm_kernel_env()}
    result["servers"].append(record)
    try:
        with serve(serve_args(args, mode), log, args.startup_timeout) as server:
            record.update(command=shlex.join(server.command),
                          startup_s=server.startup_s,
                          async_scheduling=async_scheduling(log),
                          draft_prompt_pool=resolved_prompt_pool(log))
            for prompt in warmups.values():
                # Compiles what runs on first use (the scoring kernel, ...).
                complete(server.base, args.target, prompt, 16, args.run_timeout)
            if cells and cells[0].load == "probe":
                # The first server probes; every mode then runs the rates found.
                probe_cell = cells.pop(0)
                result["probes"] = {"mode": label(args, mode), "high_rate": None,
                                    "runs": []}
                probe_rates(args, client, server.base, mode, probe_cell, logs,
                            result["probes"])
                set_rates(cells, result)
                out.write_text(json.dumps(result, indent=1))
            for cell in cells:
                row = cell_row(args, mode, cell, run_cell(
                    args, client, server.base, mode, cell, logs))
                row["plugin_env"] = record["plugin_env"]
                row["vllm_env"] = record["vllm_env"]
                print(json.dumps({k: v for k, v in row.items() if k != "runs"}),  # noqa: T201
                      flush=True)
                result["results"].append(row)
                out.write_text(json.dumps(result, indent=1))
    except (RuntimeError, OSError) as e:
        record["error"] = str(e)
    if "command" in record:
        record.update(forced_stop=server.forced_stop, log_errors=log_errors(log)[:5],
                      jit_after_start=jit_after_start(log))
    out.write_text(json.dumps(result, indent=1))


# --------------------------------------------------------------------------- #
# report
# --------------------------------------------------------------------------- #
def _s(stats: dict, digits: int = 0) -> str:
    """median (min–max)."""
    if not stats or stats.get("median") is None:
        return "–"
    fmt = f"{{:.{digits}f}}"
    if stats["n"] == 1:
        return fmt.format(stats["median"])
    return (f"{fmt.format(stats['median'])} ({fmt.format(stats['min'])}–"
            f"{fmt.format(stats['max'])})")


def busy_percent(runs: list[dict]) -> dict:
    """Spread of the runs' GPU busy shares in %, over the runs that have one
    (None on CPU; no key in files from before the sampler)."""
    return spread([100 * r["gpu_busy"] for r in runs if r.get("gpu_busy") is not None])


def stopped_cleanly(server: dict) -> str:
    """yes / no, or "not recorded" where the file was written before the server
    stopped (a call cut short): never call that clean."""
    if server.get("forced_stop") is None:
        return "not recorded"
    return "no" if server["forced_stop"] or server.get("log_errors") else "yes"


BURST_HEAD = ("| mode | concurrency | runs | failed requests | output tok/s "
              "| decode tok/s | GPU busy % | TTFT ms p50 / p99 | TPOT ms p50 / p99 "
              "| ITL ms p50 / p99 | first tokens over s / last one's decode s "
              "| acceptance length | draft context |")
RATE_HEAD = ("| mode | request rate /s | load | requests a run | runs | failed requests "
             "| output tok/s "
             "| goodput req/s | in flight | decode tok/s | GPU busy % "
             "| TTFT ms p50 / p90 / p99 | TPOT ms p50 / p90 / p99 "
             "| ITL ms p50 / p90 / p99 | acceptance length | draft context |")


def _speculation(r: dict, ok: list[dict]) -> str:
    """A line's last two cells: acceptance length, and the share of the
    context the draft read (SpecExtend's counters over the completed runs)."""
    metrics = [x["server_metrics"] for x in ok]
    full = sum(m.get("vllm:spec_extend_full_context_tokens_total", 0) for m in metrics)
    draft = sum(m.get("vllm:spec_extend_draft_context_tokens_total", 0)
                for m in metrics)
    length = r["acceptance_length"]
    return (f"| {'–' if length is None else f'{length:.2f}'} "
            f"| {f'{100 * draft / full:.1f}%' if full else '–'} |")


def _percentiles(r: dict, figure: str, digits: int, points=("p50", "p99")) -> str:
    return " / ".join(_s(r.get(f"{figure}_{p}_ms"), digits) for p in points)


def _burst_line(r: dict, ok: list[dict]) -> str:
    return (f"| {series(r)} | {r['concurrency']} | {len(ok)}/{len(r['runs'])} "
            f"| {r['failed_requests']} | {_s(r['output_tok_s'])} "
            f"| {_s(r['decode_tok_s'])} | {_s(busy_percent(ok))} "
            f"| {_percentiles(r, 'ttft', 0)} | {_percentiles(r, 'tpot', 1)} "
            f"| {_percentiles(r, 'itl', 1)} "
            f"| {_s(r.get('first_token_spread_s'), 1)} / "
            f"{_s(r.get('last_request_decode_s'), 1)} {_speculation(r, ok)}")


def _rate_line(r: dict, ok: list[dict]) -> str:
    p3 = ("p50", "p90", "p99")
    return (f"| {series(r)} | {r['request_rate']:g} | {r['load'] or '–'} "
            f"| {r.get('num_prompts') or '–'} "
            f"| {len(ok)}/{len(r['runs'])} | {r['failed_requests']} "
            f"| {_s(r['output_tok_s'])} | {_s(r['goodput'], 2)} "
            f"| {_s(r['in_flight'], 1)} | {_s(r['decode_tok_s'])} "
            f"| {_s(busy_percent(ok))} | {_percentiles(r, 'ttft', 0, p3)} "
            f"| {_percentiles(r, 'tpot', 1, p3)} | {_percentiles(r, 'itl', 1, p3)} "
            f"{_speculation(r, ok)}")


def rate_notes(rows: list[dict], target: float) -> list[str]:
    """Below a rate table: its goodput SLOs, and per series the rate to run
    next for ``target`` requests in flight (``next_rate`` over its rates)."""
    slo = rows[0].get("goodput_slo")
    notes = [("Goodput: the completed requests per second that met "
              + ", ".join(f"{k.upper()} ≤ {v:g} ms" for k, v in slo.items()) + ".")
             if slo else "Goodput: no SLOs given (--goodput)."]
    proposals = []
    for name in dict.fromkeys(series(r) for r in rows):
        mine = [r for r in rows if series(r) == name]
        probes = [(r["request_rate"], r["in_flight"]["median"]) for r in mine
                  if r["in_flight"]["median"] is not None]
        proposals.append(f"{name} {_proposal(next_rate(probes, target), probes, mine)}")
    notes.append(f"For {target:g} requests in flight, run next at (req/s, "
                 f"`next_rate`): {', '.join(proposals)}.")
    return notes


def _proposal(rate: float | None, probes: list[tuple[float, float]],
              rows: list[dict]) -> str:
    """A series' ``next_rate``, capped as ``find_rate`` caps it where one of
    its runs was overloaded; else marked where it extrapolates past twice
    every rate run (from a low load, Little's law proposed 2.4 req/s where
    the server completes 0.53: 2026-11-29)."""
    if rate is None:
        return "–"
    capacity = overload_capacity([run for r in rows for run in r.get("runs", [])])
    if capacity is not None and rate > CAPACITY_SHARE * capacity:
        return (f"{CAPACITY_SHARE * capacity:.3g} ({CAPACITY_SHARE:.0%} of the "
                f"{capacity:.3g} req/s it completed with a growing queue)")
    if rate > 2 * max(r for r, _ in probes):
        return f"{rate:.3g} (past twice every rate run: its queue may grow first)"
    return f"{rate:.3g}"


def _in_flight(run: dict) -> str:
    n = run.get("in_flight")
    return "none" if n is None else f"{n:.1f}"


def table(result: dict) -> str:
    """Markdown: a table per workload and input length (and traffic: bursts,
    rates), a line per mode and concurrency or rate; then the servers and the
    setup."""
    out = []
    target = result["meta"]["config"].get("target_in_flight") or 16
    # A group's rows share their inputs: any one of them names them.
    groups = {(r["workload"], r["input_len"], r["output_len"], rated(r)): r
              for r in result["results"]}
    for (workload, input_len, out_len, at_rate), any_row in groups.items():
        traffic = " at request rates" if at_rate else ""
        head = RATE_HEAD if at_rate else BURST_HEAD
        out += [f"### {workload}{traffic}: {inputs(any_row)}, {out_len} output tokens",
                "", head, "|" + "---|" * (head.count(" | ") + 1)]
        rows = [r for r in result["results"]
                if (r["workload"], r["input_len"], rated(r))
                == (workload, input_len, at_rate)]
        rows.sort(key=lambda r: (series_key(r), r["request_rate"] if at_rate
                                 else r["concurrency"]))
        line = _rate_line if at_rate else _burst_line
        out += [line(r, [x for x in r["runs"] if "error" not in x]) for r in rows]
        out += ["", *rate_notes(rows, target), ""] if at_rate else [""]
    if probes := result.get("probes"):
        found = probes["high_rate"]
        runs = ", ".join(f"{r['request_rate']:.3g} req/s ({_in_flight(r)} in flight)"
                         for r in probes["runs"])
        end = ("no rate found." if found is None
               else f"high {found:.3g} req/s, low half of it.")
        if capacity := probes.get("capacity"):
            end += (f" A probe ran past the server's capacity, {capacity:.3g} "
                    f"completed req/s: high is at most {CAPACITY_SHARE:.0%} of it.")
        out += [f"Rates found (`--find-rate`) on the {probes['mode']} server: "
                f"probes at {runs}; {end}", ""]
    out += ["| server | start-up s | async scheduling | stopped cleanly "
            "| kernels compiled after start-up |",
            "|---|---|---|---|---|"]
    for s in result["servers"]:
        if "error" in s:
            out.append(f"| {series(s)} | error: {error_cell(s['error'])} | | | |")
            continue
        jit = s.get("jit_after_start")  # none in files from before it was read
        out.append(f"| {series(s)} | {s['startup_s']:.0f} | {s['async_scheduling']} "
                   f"| {stopped_cleanly(s)} "
                   f"| {'not recorded' if jit is None else compiled(jit) or 'none'} |")
    meta, cfg = result["meta"], result["meta"]["config"]
    synthetic = (f"synthetic acceptance length {cfg['acceptance_length']}"
                 if cfg["acceptance_length"] > 0 else "real acceptance")
    out.append(
        f"\n{device(meta)}, vLLM {meta['vllm']}, torch {meta['torch']}, "
        f"{meta['date_utc']}, commit {(meta['git_commit'] or '?')[:7]}; "
        f"{', '.join(cfg['datasets'])} documents, K={cfg['num_spec_tokens']}, "
        f"{synthetic}; median (min–max) of {cfg['runs']} runs per cell. GPU busy: "
        "the share of the decode phase during which a kernel ran (NVML).")
    # ``meta.note``: what a reader must know that the figures do not say (a
    # call cut short, a rerun), written into the file by hand after a merge
    # (``merge_results`` keeps the first file's meta only).
    if meta.get("note"):
        out.append(f"\n{meta['note']}")
    return "\n".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p, argv, serve_extra = serve_args_parser(__doc__, argv)
    p.add_argument("--target", required=True, help="target model (dir or name)")
    p.add_argument("--draft",
                   help="draft model of the draft_model and spec_extend modes")
    p.add_argument("--tokenizer", help="for the servers, the client and the "
                   "datasets (default: --target); with dummy weights it must know "
                   "every id of the model's vocabulary (builders pad-tokenizer)")
    p.add_argument("--modes", nargs="+", choices=modes.MODES,
                   default=["plain", "draft_model", "spec_extend"])
    p.add_argument("--method", choices=modes.METHODS, default="draft_model",
                   help="vLLM's speculation method of the draft_model and "
                   "spec_extend modes (eagle3: --draft is an EAGLE-3 head)")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--input-lens", nargs="+", type=int, default=[16384, 32768],
                   help="prompt tokens (before the server adds BOS)")
    p.add_argument("--concurrency", nargs="+", type=int,
                   help="bursts: requests at once (default: 1 4 16 32)")
    p.add_argument("--request-rates", nargs="+", type=float, metavar="RATE",
                   help="instead of bursts: requests per second, Poisson arrivals")
    p.add_argument("--load", nargs="+", choices=LOADS,
                   help="a label per request rate (one: every rate's)")
    p.add_argument("--goodput", nargs="+", metavar="METRIC:MS",
                   help="SLOs for vllm bench serve's goodput, e.g. ttft:20000 "
                   f"tpot:50 (metrics: {', '.join(GOODPUT_METRICS)})")
    p.add_argument("--find-rate", type=float, metavar="RATE",
                   help="instead of --request-rates: probe the first mode's "
                   "server from RATE on (--probes runs) for the rate with "
                   "--target-in-flight requests in flight, then run every mode "
                   "there (load high) and at half of it (low); --load high "
                   "or low alone runs that load only")
    p.add_argument("--probes", type=int, default=2,
                   help="--find-rate's probe runs (each at next_rate of those before)")
    p.add_argument("--target-in-flight", type=float, default=16.0,
                   help="rate tables propose the rate for this many requests "
                   "in flight (next_rate)")
    p.add_argument("--num-prompts", nargs="+", type=int,
                   help="requests per run: one number, or one per concurrency "
                   "or rate (default: 2 x concurrency; 32 at a rate)")
    p.add_argument("--runs", type=int, default=3, help="runs per cell")
    p.add_argument("--long-output-len", type=int, default=1024)
    p.add_argument("--doc-output-len", type=int, default=512)
    p.add_argument("--short-output-len", type=int, default=128)
    p.add_argument("--mixed-short-len", type=int, default=1024,
                   help="the mixed workload's short inputs (the long ones: "
                   "--input-lens)")
    p.add_argument("--datasets", nargs="+", choices=prompts.DATASETS,
                   default=list(prompts.DATASETS))
    p.add_argument("--num-spec-tokens", type=int, default=4)
    p.add_argument("--acceptance-length", type=float, default=0.0,
                   help="synthetic mean acceptance length (random weights); "
                   "0: real rejection sampling")
    p.add_argument("--spec-extend", default=json.dumps(SPEED_SPEC_EXTEND),
                   metavar="JSON")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--run-timeout", type=float, default=1800.0,
                   help="seconds for each bench run (and each warm-up request)")
    p.add_argument("--bench-arg", action="append", default=[],
                   help="extra argument for vllm bench serve (repeatable), "
                   "e.g. --bench-arg=--request-rate=4")
    p.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args(argv)
    args.serve_args = serve_extra
    args.tokenizer = args.tokenizer or args.target
    if error := check_traffic(args):
        p.error(error)
    if "mixed" in args.workloads and args.mixed_short_len >= min(args.input_lens):
        p.error("--mixed-short-len must be shorter than every --input-lens")
    if args.draft is None and any(map(modes.needs_draft, args.modes)):
        p.error("--draft is needed by the draft_model and spec_extend modes")
    if gap := tokenizer_gap(args.target, args.tokenizer, args.serve_args):
        p.error(gap)
    if gap := modes.plugin_gap(args.modes):
        p.error(gap)
    return args


def _per_item(values: list | None, n: int) -> list | None:
    """One value per item: ``values`` as given, or its one value n times."""
    return values * n if values and len(values) == 1 else values


def _slo_error(slo: str) -> str | None:
    name, _, ms = slo.partition(":")
    try:
        ok = name in GOODPUT_METRICS and float(ms) >= 0
    except ValueError:
        ok = False
    return None if ok else f"--goodput {slo}: METRIC:MS, METRIC of {GOODPUT_METRICS}"


def check_traffic(args) -> str | None:
    """What is wrong with the traffic options, or None once their defaults are
    filled in: ``concurrency`` (None at rates), ``num_prompts`` and ``load``
    (None for bursts) one per concurrency or rate."""
    if args.find_rate is not None:
        if args.request_rates or args.concurrency:
            return "--find-rate sets the rates: no --request-rates or --concurrency"
        if args.find_rate <= 0 or args.probes < 1:
            return "--find-rate must be above 0, --probes at least 1"
        if len(args.workloads) * len(args.input_lens) != 1:
            return "--find-rate probes one workload at one input length"
        # --load picks the loads and their order; high first by default, so a
        # table cut short (device time) still holds every mode's high load.
        args.load = args.load or ["high", "low"]
        if len(set(args.load)) != len(args.load):
            return "--load with --find-rate: each load once (high, low)"
        # Placeholders until the probes have run (set_rates).
        args.request_rates = [args.find_rate / (1 if load == "high" else 2)
                              for load in args.load]
    rates = args.request_rates or []
    if rates and args.concurrency:
        return "--concurrency (bursts) or --request-rates, not both"
    if args.load and not rates:
        return "--load labels --request-rates"
    if any(r <= 0 for r in rates):
        return "--request-rates must be above 0"
    if len(set(rates)) != len(rates):
        return "--request-rates: each rate once (a rate names its runs' files)"
    if error := next(filter(None, map(_slo_error, args.goodput or [])), None):
        return error
    args.concurrency = None if rates else args.concurrency or [1, 4, 16, 32]
    steps = rates or args.concurrency
    args.num_prompts = _per_item(args.num_prompts, len(steps)) or (
        [32] * len(rates) or [2 * c for c in args.concurrency])
    if len(args.num_prompts) != len(steps):
        return "--num-prompts needs one number or one per --concurrency or rate"
    if not rates:
        return None
    args.load = _per_item(args.load, len(rates)) or [None] * len(rates)
    if len(args.load) != len(rates):
        return "--load needs one label or one per --request-rates"
    return None


def traffics(args) -> list[Traffic]:
    """A ``Traffic`` per concurrency or request rate (``check_traffic``'d)."""
    if args.request_rates:
        return [Traffic(None, n, r, load) for r, n, load in zip(
            args.request_rates, args.num_prompts, args.load, strict=True)]
    return [Traffic(c, n) for c, n in zip(args.concurrency, args.num_prompts,
                                          strict=True)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the running server is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / "results.json"
    result = {"meta": run_metadata(args, bench="serve"), "servers": [], "results": []}
    warmups, cells = plan(args)
    (args.out_dir / "logs").mkdir(exist_ok=True)
    with BenchClient(args.out_dir / "logs" / "bench_client.log") as client:
        for mode in args.modes:
            run_mode(args, client, mode, warmups, cells, result, out)
            probes = result.get("probes")
            if probes and probes["high_rate"] is None:
                break  # --find-rate found no rate: nothing to run at
    summary = table(result)
    (args.out_dir / "summary.md").write_text(summary + "\n")
    print(summary)  # noqa: T201
    if importlib.util.find_spec("matplotlib"):
        from benchmarks.serve.plot_serve import plot_all

        plot_all(result, args.out_dir)
    bad = [s for s in result["servers"] if "error" in s]
    bad += [r for r in result["results"] if r["failed_requests"] or r["failed_runs"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
