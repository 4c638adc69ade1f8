"""Where a decode step's GPU time goes: one profiled stretch of decoding.

An in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the profiler
sees the engine's kernels) with ``bench_decode``'s settings for one mode,
warmed up at the cell's shape, then ``--tokens`` new tokens under
``torch.profiler``. Prints the kernels by GPU time, their sum per decode step
(steps = the engine's verification count) against the wall time per step,
and writes the table and a Chrome trace under ``--out-dir``. For profiling
only: a hand-held in-process engine, no speed claim.

vLLM's own scopes are on (``VLLM_CUSTOM_SCOPES_FOR_PROFILING``), so the
summary has the host and device ms of ``gpu_model_runner: draft`` beside the
model forward, sampling and the rest, and each scope's median GPU span (a
steady step's). Only vLLM's V1 runner opens these scopes: a mode on its V2
runner (plain decoding, by vLLM's default) has none, only the kernel sums.

Under tensor parallelism (``--tensor-parallel-size N``) the kernels run in
vLLM's worker processes, out of this process's profiler's sight: vLLM's own
profiler then traces every worker (``profiler_config``, ``LLM.start_profile``),
one Chrome trace per rank under ``--out-dir``, and the summary has each rank's
kernels by category and runner scopes (``ranks``): where a step's time goes
on each GPU.

``--prefill`` profiles a request's prompt instead (issue #22's time to first
token): a fresh prompt of ``--context`` tokens (another seed, so no prefix is
cached) with one new token, every chunk of it; its summary has the request's
wall time. With ``--batch`` B and ``--prefill-tokens`` N the B fresh prompts
each get N new tokens, so requests that have their first token decode (and
draft) beside the later prompts' chunks, as in ``bench_decode``'s batch-8
cell (issue #45: its last first token +2.5–3.6% over plain's); N of 64 keeps
every request decoding until the last prompt ends. The summary's
``first_token_window`` is the work from the ``generate`` call's start to its
last first token (``window_work``): GPU busy ms and kernel ms by category, and
each runner scope's ms in it, so two modes' windows can be set side by side.

    python -m benchmarks.gpu.profile_step --mode spec_extend --context 65536 \\
        --target-config .gpu/models/llama31_8b --draft-config .gpu/models/llama32_1b
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.harness.measure import covered_seconds

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
SCOPE = "gpu_model_runner: "

CATEGORIES = (
    ("attention", ("flash", "fmha", "attn")),
    ("matmul", ("gemm", "gemv", "cutlass", "nvjet", "sm90", "matmul")),
    ("copy", ("memcpy", "memset", "copy")),
    ("triton", ("triton",)),
)


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="spec_extend")
    p.add_argument("--target-config", required=True)
    p.add_argument("--draft-config", default=None)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--spec-extend", default=None)
    p.add_argument("--prefill", action="store_true",
                   help="profile a fresh prompt and its first token, not decoding")
    p.add_argument("--prefill-tokens", type=int, default=1, metavar="N",
                   help="with --prefill: new tokens a request (1: the prompt "
                        "alone; 64 at batch 8: the first requests decode "
                        "beside the later prompts)")
    p.add_argument("--out-dir", type=Path, required=True)
    # Other flags (--block-size, --dtype, ...) are bench_decode's engine settings.
    args, engine_flags = p.parse_known_args(argv)
    if args.prefill_tokens != 1 and not args.prefill:
        p.error("--prefill-tokens needs --prefill (decoding profiles take --tokens)")
    # vLLM's runner scopes (model forward, draft, sample, ...), read when the
    # runner first opens one: before the engine.
    os.environ["VLLM_CUSTOM_SCOPES_FOR_PROFILING"] = "1"

    import torch
    from vllm import LLM

    from benchmarks.decode import bench_decode
    from benchmarks.harness.meta import run_metadata
    from benchmarks.longinput.acceptance import counter_delta, spec_counters

    bench_argv = ["--target-config", args.target_config, "--modes", args.mode,
                  "--contexts", str(args.context), "--batch-sizes", str(args.batch),
                  "--output-len", str(args.tokens), "--out", "/dev/null",
                  *engine_flags]
    if args.draft_config:
        bench_argv += ["--draft-config", args.draft_config]
    if args.spec_extend:
        bench_argv += ["--spec-extend", args.spec_extend]
    bargs = bench_decode.parse_args(bench_argv)
    root = args.out_dir / "models"
    target = bench_decode.model_dir(args.target_config, root)
    draft = args.draft_config and bench_decode.model_dir(args.draft_config, root)
    engine = bench_decode.engine_args(bargs, args.mode, target, draft)
    name = f"{args.mode}_{args.context}_b{args.batch}{'_prefill' if args.prefill else ''}"
    gpus = engine.get("tensor_parallel_size") or 1
    workers = gpus > 1
    trace_dir = args.out_dir / f"traces_{name}"
    if workers:
        engine["profiler_config"] = {
            "profiler": "torch", "torch_profiler_dir": str(trace_dir.resolve()),
            "torch_profiler_with_stack": False, "torch_profiler_use_gzip": False}
    llm = LLM(**engine)
    vocab = json.loads(Path(target, "config.json").read_text())["vocab_size"]
    prompts = bench_decode.prompts_for(vocab, 0, args.context, args.batch, 0)
    bench_decode.generate(llm, prompts, 16)  # warm-up, and the prefix cached

    counts = spec_counters(llm)
    activities = [torch.profiler.ProfilerActivity.CPU,
                  torch.profiler.ProfilerActivity.CUDA]
    if args.prefill:
        prompts = bench_decode.prompts_for(vocab, 1, args.context, args.batch, 0)
    with torch.profiler.profile(activities=activities) as prof:
        if workers:
            llm.start_profile(profile_prefix=name)
        start = time.perf_counter()
        # A host marker at the call's start: the first-token window's origin
        # on the trace's clock (the kernels' clock too).
        with torch.profiler.record_function(GENERATE_MARK):
            run = bench_decode.generate(
                llm, prompts, args.prefill_tokens if args.prefill else args.tokens,
                gpus)
        wall = time.perf_counter() - start
        if workers:
            llm.stop_profile()  # each rank writes its trace
    spec = counter_delta(counts, spec_counters(llm))
    if args.prefill:
        steps = 1  # the whole prompt: figures per request, not per step
    else:
        steps = spec["drafts"] // args.batch if spec["drafts"] else args.tokens

    args.out_dir.mkdir(parents=True, exist_ok=True)
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=45)
    (args.out_dir / f"profile_{name}.txt").write_text(table)
    trace = args.out_dir / f"trace_{name}.json"
    prof.export_chrome_trace(str(trace))
    trace_events = json.loads(trace.read_text())["traceEvents"]
    by_cat = kernel_ms_by_category(trace_events)
    summary = {
        "meta": run_metadata(args, engine_flags=engine_flags),
        "mode": args.mode, "context": args.context, "batch": args.batch,
        "prefill": args.prefill, "steps": steps,
        # All profiled kernels over the verifications: the stretch's first
        # steps (the prompt's cached remainder) count in it too.
        "gpu_ms_per_step": sum(by_cat.values()) / steps,
        "wall_ms_per_step": 1000 * wall / steps,
        "gpu_ms_per_step_by_category": {k: v / steps for k, v in sorted(by_cat.items())},
        "scope_spans": scope_spans(trace_events),
    }
    if args.prefill:
        summary["ttft_s_median"] = run.get("ttft_s_median")
        summary["ttft_s"] = run.get("ttft_s")
        summary["first_token_window"] = first_token_window(trace_events,
                                                           run["ttft_s"])
    else:
        summary["decode_tok_s"] = run["decode_tok_s"]
    summary["runner_scopes"] = runner_scopes(prof.key_averages())
    if workers:
        summary["ranks"] = rank_summaries(trace_dir, steps)
        keep_rank0_trace(trace_dir, args.out_dir / f"trace_{name}_rank0.json.gz")
    (args.out_dir / f"profile_{name}.json").write_text(json.dumps(summary, indent=1))
    print(table)  # noqa: T201
    print(json.dumps(summary, indent=1))  # noqa: T201
    llm.llm_engine.engine_core.shutdown()
    return 0


KERNEL_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")
"""The trace's categories of work on the GPU (annotations are spans, not work)."""

GENERATE_MARK = "profile_step: generate"
"""The host annotation around the profiled ``generate`` call."""


def first_token_window(trace_events: list[dict], ttft_s: float) -> dict | None:
    """``window_work`` from the profiled ``generate`` call's start (its host
    marker) to ``ttft_s`` later: the last first token, as the request's
    metrics time it from its arrival (the call adds every request at once).
    None where the trace has no marker."""
    starts = [e["ts"] for e in trace_events if e.get("name") == GENERATE_MARK
              and e.get("cat") not in ("gpu_user_annotation", *KERNEL_EVENTS)]
    if not starts or ttft_s is None:
        return None
    begin = min(starts)
    return window_work(trace_events, begin, begin + ttft_s * 1e6)


def window_work(trace_events: list[dict], begin: float, end: float,
                min_us: float = 10.0) -> dict:
    """The GPU's work between ``begin`` and ``end`` (µs, the trace's clock),
    each kernel, copy and scope span clipped to it: the window's ms, the ms
    in which some kernel ran (streams overlapping counted once), kernel ms by
    ``category`` (summed, so overlaps count twice there), and per vLLM runner
    scope (spans of at least ``min_us``) the spans it overlaps, their clipped
    ms and the busy ms inside them; where the GPU waited (``idle_gaps``) and
    how many copies came from pageable host memory, and where the host
    itself waited (``host_waits``). Plain decoding on Model
    Runner V2 opens no scopes: its window has the kernels only."""
    def clip(b: float, e: float) -> tuple[float, float] | None:
        b, e = max(b, begin), min(e, end)
        return (b, e) if e > b else None

    work = [(w, ev["name"]) for ev in trace_events
            if ev.get("cat") in KERNEL_EVENTS
            and (w := clip(ev["ts"], ev["ts"] + ev["dur"])) is not None]
    by_cat: dict[str, float] = defaultdict(float)
    for (b, e), name in work:
        by_cat[category(name)] += (e - b) / 1000.0
    intervals = [w for w, _ in work]
    scopes = {}
    for scope, found in scope_bounds(trace_events, min_us).items():
        inside = [c for b, e in found if (c := clip(b, e)) is not None]
        if not inside:
            continue
        scopes[scope] = {"spans": len(inside),
                         "span_ms": sum(e - b for b, e in inside) / 1000.0,
                         "busy_ms": sum(busy_us(intervals, sb, se)
                                        for sb, se in inside) / 1000.0}
    return {
        "ms": (end - begin) / 1000.0,
        "busy_ms": covered_seconds(intervals) / 1000.0,
        "kernel_ms_by_category": dict(sorted(by_cat.items())),
        "scopes": scopes,
        "idle": idle_gaps(trace_events, work, begin, end),
        "host_waits": host_waits(trace_events, begin, end),
        # A copy from pageable host memory waits for the stream: the host
        # loses its lead over the GPU (staging.copy_to).
        "pageable_copies": sum("Pageable" in name for _, name in work),
    }


HOST_EVENTS = ("user_annotation", "cpu_op")
"""The trace's host-side spans: what the host ran while the GPU waited."""


def host_spans(trace_events: list[dict]):
    """``innermost(cat, at)``: the name of the innermost host span of ``cat``
    (one of ``HOST_EVENTS``) open at ``at`` (µs), or None."""
    host = {cat: sorted((ev["ts"], ev["ts"] + ev.get("dur", 0.0), ev["name"])
                        for ev in trace_events if ev.get("cat") == cat
                        and ev.get("name") != GENERATE_MARK)
            for cat in HOST_EVENTS}
    starts = {cat: [h[0] for h in rows] for cat, rows in host.items()}

    def innermost(cat: str, at: float) -> str | None:
        rows, i = host[cat], bisect.bisect_right(starts[cat], at)
        for b, e, name in reversed(rows[max(0, i - 256):i]):
            if e >= at:
                return name
        return None

    return innermost


RUNTIME_EVENTS = ("cuda_runtime", "cuda_driver")
BLOCKING_CALLS = ("cudaFree", "cudaMalloc", "cudaHostAlloc", "cudaMemcpy", "cudaMemcpy2D")
"""CUDA API calls that can hold the host until the GPU catches up, besides
every ``*Synchronize``: frees (the caching allocator's retry after a failed
allocation frees its cache and synchronises the device), allocations and
synchronous copies. ``cudaMemcpyAsync`` waits only from pageable memory,
which ``window_work`` counts apart (``pageable_copies``)."""


def blocking(name: str) -> bool:
    return name in BLOCKING_CALLS or "Synchronize" in name


def host_waits(trace_events: list[dict], begin: float, end: float,
               stall_us: float = 1000.0, top: int = 8) -> dict:
    """Where the host itself waited inside a window: the CUDA API calls that
    can block it (``BLOCKING_CALLS``; count and ms by name) and any API call,
    launches included, that took at least ``stall_us`` (a launch that long
    found the GPU's queue full: the host had caught up with the GPU), the
    ``top`` longest with the innermost host span and op around each. Under
    async scheduling a step's output is read only after the next step is
    launched, so a host wait there delays first tokens even while the GPU is
    busy; ``idle_gaps`` cannot see it. Calls count by their overlap with the
    window; a wait is put on the innermost span open at its middle on any
    host thread (the engine's steps run on one)."""
    innermost = host_spans(trace_events)
    by_name: dict[str, list] = defaultdict(lambda: [0, 0.0])
    stalls = []
    for ev in trace_events:
        if ev.get("cat") not in RUNTIME_EVENTS:
            continue
        name = ev["name"]
        b, e = max(ev["ts"], begin), min(ev["ts"] + ev.get("dur", 0.0), end)
        if e <= b:
            continue
        dur = e - b
        if blocking(name):
            by_name[name][0] += 1
            by_name[name][1] += dur / 1000.0
        if dur >= stall_us:
            mid = (b + e) / 2
            stalls.append({"at_ms": round((b - begin) / 1000.0, 3),
                           "ms": round(dur / 1000.0, 3), "call": name,
                           "host": innermost("user_annotation", mid) or "(none)",
                           "op": innermost("cpu_op", mid)})
    stalls.sort(key=lambda r: -r["ms"])
    return {"blocking": {n: {"calls": c, "ms": round(ms, 3)}
                         for n, (c, ms) in sorted(by_name.items(), key=lambda kv: -kv[1][1])},
            "stalls": len(stalls), "stall_ms": round(sum(r["ms"] for r in stalls), 3),
            "top": stalls[:top]}


def idle_gaps(trace_events: list[dict], work: list, begin: float, end: float,
              min_us: float = 20.0, top: int = 12) -> dict:
    """Where the GPU waited inside a window: its gaps of at least ``min_us``
    between the ``work`` [((begin, end), kernel name)] already clipped to it.
    Their ms and count, their ms by the host span open at each gap's middle
    (the innermost annotation, a vLLM runner scope or ``record_function``,
    else ``(none)``: the engine's own Python, the scheduler among it), and the
    ``top`` longest with their place (ms into the window), that span, the
    innermost host op and the kernels either side. A busy share says how much
    the GPU waited; this says at what."""
    gaps, reach, last = [], begin, None
    for (b, e), name in sorted(work, key=lambda w: w[0]):
        if b - reach >= min_us:
            gaps.append((reach, b, last, name))
        if e > reach:
            reach, last = e, name
    if end - reach >= min_us:
        gaps.append((reach, end, last, None))
    innermost = host_spans(trace_events)
    by_host: dict[str, float] = defaultdict(float)
    rows = []
    for b, e, before, after in gaps:
        mid = (b + e) / 2
        span = innermost("user_annotation", mid) or "(none)"
        by_host[span] += (e - b) / 1000.0
        rows.append({"at_ms": round((b - begin) / 1000.0, 3),
                     "ms": round((e - b) / 1000.0, 3), "host": span,
                     "op": innermost("cpu_op", mid),
                     "before": before and before[:80], "after": after and after[:80]})
    rows.sort(key=lambda r: -r["ms"])
    return {"ms": sum((e - b) for b, e, _, _ in gaps) / 1000.0, "gaps": len(gaps),
            "by_host_ms": dict(sorted(by_host.items(), key=lambda kv: -kv[1])[:top]),
            "top": rows[:top]}


def kernel_ms_by_category(trace_events: list[dict]) -> dict[str, float]:
    """GPU ms per ``category`` from a Chrome trace's kernels, copies and sets
    (torch's GPU annotations of vLLM's scopes cover kernels, and counting them
    would count those kernels twice)."""
    by_cat: dict[str, float] = defaultdict(float)
    for e in trace_events:
        if e.get("cat") in KERNEL_EVENTS:
            by_cat[category(e["name"])] += e["dur"] / 1000.0
    return dict(by_cat)


def scope_bounds(trace_events: list[dict], min_us: float) -> dict[str, list]:
    """Per vLLM runner scope, its GPU spans of at least ``min_us`` (vLLM opens
    some scopes twice a step, once empty): ``[(begin, end)]`` in µs."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in trace_events:
        if (e.get("cat") == "gpu_user_annotation" and e["name"].startswith(SCOPE)
                and e["dur"] >= min_us):
            spans[e["name"][len(SCOPE):]].append((e["ts"], e["ts"] + e["dur"]))
    return spans


def busy_us(work: list[tuple[float, float]], begin: float, end: float) -> float:
    """µs between ``begin`` and ``end`` in which some of ``work`` ran: each
    interval clipped to the span, overlaps (streams) counted once."""
    return covered_seconds((max(b, begin), min(e, end)) for b, e in work
                           if b < end and e > begin)


def scope_spans(trace_events: list[dict], min_us: float = 10.0) -> dict[str, dict]:
    """Per vLLM runner scope, from a Chrome trace: its GPU spans' median and
    the median GPU busy ms inside them (time in which a kernel or copy ran,
    on any stream), over the spans of at
    least ``min_us`` (vLLM opens some scopes twice a step, once empty). The
    median keeps a profiled stretch's first steps, which also hold a fresh
    request's work, out of a step's figure."""
    spans = scope_bounds(trace_events, min_us)
    work = [(e["ts"], e["ts"] + e["dur"]) for e in trace_events
            if e.get("cat") in KERNEL_EVENTS]
    out = {}
    for scope, found in spans.items():
        busy = [busy_us(work, begin, end) / 1000.0 for begin, end in found]
        out[scope] = {"calls": len(found),
                      "median_span_ms": statistics.median(e - b for b, e in found) / 1000.0,
                      "median_busy_ms": statistics.median(busy)}
    return out


def scope_kernels(trace_events: list[dict], min_us: float = 10.0,
                  top: int = 12) -> dict[str, dict]:
    """Per vLLM runner scope, the median over its spans (of at least
    ``min_us``) of all its kernels' launches and µs in a span (kernels that
    start inside it), and its ``top`` kernels by µs, each by the same
    medians. Medians, as in ``scope_spans``: a profiled stretch's first spans
    also hold a fresh request's work. Where a step's time goes kernel by
    kernel (issue #44: a sharded draft forward is some 200 small kernels)."""
    spans = scope_bounds(trace_events, min_us)
    work = sorted((e["ts"], e["dur"], e["name"]) for e in trace_events
                  if e.get("cat") in KERNEL_EVENTS)
    starts = [w[0] for w in work]
    out = {}
    for scope, found in spans.items():
        per_span = []  # [spans] of {name: [launches, µs]}
        for begin, end in found:
            seen: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
            inside = work[bisect.bisect_left(starts, begin):
                          bisect.bisect_left(starts, end)]
            for _, dur, name in inside:
                seen[name][0] += 1
                seen[name][1] += dur
            per_span.append(seen)
        rows = []
        for name in {n for seen in per_span for n in seen}:
            calls = statistics.median(s[name][0] if name in s else 0
                                      for s in per_span)
            us = statistics.median(s[name][1] if name in s else 0.0
                                   for s in per_span)
            if us > 0:
                # The name cut for reading only: kernels are told apart whole.
                rows.append({"kernel": name[:160], "calls": calls, "us": round(us, 1)})
        out[scope] = {
            "launches": statistics.median(sum(c for c, _ in s.values())
                                          for s in per_span),
            "us": round(statistics.median(sum(u for _, u in s.values())
                                          for s in per_span), 1),
            "top": sorted(rows, key=lambda r: -r["us"])[:top],
        }
    return out


def rank_traces(trace_dir: Path) -> dict[int, Path]:
    """Each TP rank's Chrome trace in ``trace_dir``, as vLLM's worker
    profiler names them (``<prefix>_<suffix>.<time>.pt.trace.json``, vLLM
    0.26's ``get_worker_rank_suffix``): ``dp0_pp0_tp<rank>_dcp0_ep0_rank<g>``
    where every parallel group exists, but ``rank<g>`` alone for a dense model
    (its expert-parallel group does not exist, and the suffix falls back; seen
    on two H200s, 2026-11-28). With tensor parallelism alone the global rank
    is the TP rank."""
    traces = {}
    for path in sorted(trace_dir.glob("*.pt.trace.json")):
        found = (re.search(r"_tp(\d+)_", path.name)
                 or re.search(r"(?:^|_)rank(\d+)\.", path.name))
        if found:
            traces[int(found.group(1))] = path
    return dict(sorted(traces.items()))


def rank_summaries(trace_dir: Path, steps: int) -> dict[str, dict]:
    """Per TP rank, from its worker's trace: GPU ms per step by category,
    their sum, vLLM's runner scopes' median spans (``scope_spans``) and
    their top kernels (``scope_kernels``)."""
    out = {}
    for rank, path in rank_traces(trace_dir).items():
        events = json.loads(path.read_text())["traceEvents"]
        by_cat = kernel_ms_by_category(events)
        out[str(rank)] = {
            "trace": path.name,
            "gpu_ms_per_step": sum(by_cat.values()) / steps,
            "gpu_ms_per_step_by_category": {k: v / steps
                                            for k, v in sorted(by_cat.items())},
            "scope_spans": scope_spans(events),
            "scope_kernels": scope_kernels(events),
        }
    return out


def keep_rank0_trace(trace_dir: Path, dest: Path) -> None:
    """Rank 0's trace, gzipped, beside the summary (a host brings a few files
    back, not the folder of every rank's); where rank 0's is not found, say
    what the folder holds (the summary's ``ranks`` then lacks it)."""
    import gzip
    import shutil

    traces = rank_traces(trace_dir)
    if 0 not in traces:
        held = sorted(p.name for p in trace_dir.glob("*")) if trace_dir.is_dir() else []
        print(f"profile_step: no rank 0 trace in {trace_dir}; it holds {held}",  # noqa: T201
              file=sys.stderr)
        return
    with traces[0].open("rb") as src, gzip.open(dest, "wb") as out:
        shutil.copyfileobj(src, out)


def runner_scopes(events) -> dict[str, dict[str, float]]:
    """Each of vLLM's runner scopes (``gpu_model_runner: draft``, ``...
    sample``, ...), summed over its calls: host ms and the device ms of the
    kernels launched inside it (its CPU event), and the span it covers on the
    GPU, idle gaps included (the GPU annotation torch adds under the same
    name, where there is one)."""
    scopes: dict[str, dict[str, float]] = {}
    for e in events:
        if not e.key.startswith(SCOPE):
            continue
        row = scopes.setdefault(e.key[len(SCOPE):], {})
        if getattr(e.device_type, "name", "CPU") == "CPU":
            row.update(calls=e.count, cpu_ms=e.cpu_time_total / 1000.0,
                       device_ms=e.device_time_total / 1000.0)
        else:
            row["gpu_span_ms"] = e.device_time_total / 1000.0
    return scopes


if __name__ == "__main__":
    raise SystemExit(main())
