"""Where a real-pair decode step's time goes: a few of a cell's prompts under
``torch.profiler``, one mode.

The real-weight grid (``run.py``) says how fast each mode is; this says why:
per verification step, the GPU ms of the target's forward, the drafter
(vLLM's ``gpu_model_runner: draft`` scope: the plugin's retrieval, view and
captured routine, or vLLM's draft model or prompt lookup), sampling and the
rest, beside the wall ms of a step: the gap between them is the host.

An in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the profiler
sees the engine's kernels, and ``VLLM_CUSTOM_SCOPES_FOR_PROFILING=1`` for
vLLM's runner scopes) with ``run.engine_kwargs`` for the mode, warmed up as
``run.py`` warms up, the prefix cache emptied, then ``--prompts`` of the
cell's fresh prompts, one ``generate`` each (a cell's ``:batch`` of B: one
``generate`` of B prompts), profiled together. At batch B > 1 a decode step
serves several rows, so there is no per-step breakdown; instead the first
call's ``first_token_window`` (``profile_step``): the GPU's work from the
call's start to its last first token, per runner scope, with its idle gaps:
where eight fresh prompts' first tokens wait (2026-12-06: 0.49 s for the
first of eight 16K prompts against plain's 0.14 s), with where the host
itself waited in it (``host_waits``: blocking CUDA calls, launches that
found the queue full) and the caching allocator's counters over the calls
(``allocator``: a retry synchronises the device). Each prompt's
prefill is in the trace too: the scopes' figures are medians over their
spans, which decode steps outnumber (``profile_step.scope_spans``). For
profiling only: the profiler's host tracing slows the host, so ``host_ms``
is an upper bound (set it beside ``run.py``'s unprofiled step times); no
speed claim.

    python -m benchmarks.realpair.profile --cases CASES --target DIR \\
        --draft DIR --mode spec_extend_full_pass --cell copy:16384 --out-dir OUT
    (--cell copy:16384:8: one generate of 8 prompts, its first-token window)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from benchmarks.gpu.profile_step import (GENERATE_MARK, first_token_window,
                                         kernel_ms_by_category, runner_scopes,
                                         scope_kernels, scope_spans)
from benchmarks.realpair import run, tasks

STEP_SCOPES = ("forward", "draft", "sample", "bookkeep")
"""vLLM 0.26's runner scopes of a step, the ones ``step_profile`` reports."""


def step_profile(spans: dict[str, dict], wall_ms_per_step: float) -> dict:
    """A decode step's breakdown from ``scope_spans``: each step scope's
    median GPU busy ms, their sum, and the wall ms a decode step took (first
    token to last, over the steps); ``host_ms`` is the wall
    time in which none of them kept the GPU busy (launches, scheduling, the
    plugin's and vLLM's Python), never below 0."""
    parts = {name: round(spans[name]["median_busy_ms"], 3)
             for name in STEP_SCOPES if name in spans}
    gpu = sum(parts.values())
    return {"gpu_ms": parts, "gpu_ms_sum": round(gpu, 3),
            "wall_ms": round(wall_ms_per_step, 3),
            "host_ms": round(max(0.0, wall_ms_per_step - gpu), 3)}


ALLOCATOR_COUNTS = ("num_alloc_retries", "num_sync_all_streams", "num_device_alloc",
                    "num_device_free")
"""``torch.cuda.memory_stats`` counters that mark the host waiting on the
GPU's memory: retries (the cache freed, the device synchronised), whole
synchronisations, and cudaMalloc/cudaFree calls."""


def allocator_counts(torch) -> dict[str, int]:
    """``ALLOCATOR_COUNTS`` now; empty without CUDA."""
    if not torch.cuda.is_available():
        return {}
    stats = torch.cuda.memory_stats()
    return {k: int(stats.get(k, 0)) for k in ALLOCATOR_COUNTS}


def main(argv: list[str] | None = None) -> int:
    ap = run.mode_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--cell", default="copy:16384",
                    help="one group:context[:batch] (batch 1 unless named)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--out-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    parts = args.cell.split(":")
    if (len(parts) not in (2, 3) or " " in args.cell
            or (len(parts) == 3 and not (parts[2].isdigit() and int(parts[2]) > 0))):
        ap.error(f"--cell {args.cell!r}: one group:context[:batch], e.g. copy:16384:8")
    cell = ":".join(parts[:2])
    batch = int(parts[2]) if len(parts) == 3 else 1
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ["VLLM_CUSTOM_SCOPES_FOR_PROFILING"] = "1"

    import torch
    from vllm import LLM, SamplingParams

    from benchmarks.harness.meta import run_metadata
    from benchmarks.longinput.acceptance import counter_delta, spec_counters

    kwargs = run.mode_kwargs(args)
    header, cases = tasks.load_cases(args.cases)
    (_, _, picked), = run.select(cases, [f"{cell}:1"])
    picked = picked[:max(args.prompts, batch)]
    calls = [picked[i:i + batch] for i in range(0, len(picked), batch)]
    llm = LLM(**kwargs)
    run.warm_up(llm, picked[0])
    run.empty_prefix_cache(llm)
    counts = spec_counters(llm) if "speculative_config" in kwargs else None
    tokens, decode_s, first_ttfts = 0, 0.0, None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    alloc_before = allocator_counts(torch)
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for i, call in enumerate(calls):
            # The first call's start on the trace's clock: its first-token window.
            with torch.profiler.record_function(GENERATE_MARK if i == 0 else "generate"):
                outs = llm.generate(
                    [{"prompt_token_ids": c.prompt_ids} for c in call],
                    [SamplingParams(temperature=0.0, max_tokens=c.max_tokens) for c in call],
                    use_tqdm=False)
            times = [run.request_times(out) for out in outs]
            tokens += sum(len(out.outputs[0].token_ids) for out in outs)
            decode_s += sum(t["decode_s"] or 0.0 for t in times)
            if i == 0 and all(t["ttft_s"] is not None for t in times):
                first_ttfts = sorted(t["ttft_s"] for t in times)
        wall = time.perf_counter() - start
    first_ttft = first_ttfts[-1] if first_ttfts else None  # the call's last
    alloc = {k: v - alloc_before.get(k, 0) for k, v in allocator_counts(torch).items()}
    spec = counter_delta(counts, spec_counters(llm)) if counts is not None else None
    # Decode steps: each gives one token plus those it accepted, after each
    # prompt's first token (its prefill's). vLLM counts drafts only on steps
    # that had some (prompt lookup proposes on some steps only).
    steps = tokens - len(picked) - (spec["accepted_tokens"] if spec else 0)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    name = (f"{args.mode}_k{args.k}_{cell.replace(':', '_')}"
            + (f"_b{batch}" if batch > 1 else ""))
    trace = args.out_dir / f"trace_{name}.json"
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    spans = scope_spans(events)
    by_cat = kernel_ms_by_category(events)
    summary = {
        "meta": run_metadata(args, engine_kwargs=kwargs, cases_sha256=header.get("sha256")),
        "mode": args.mode, "k": args.k, "cell": cell, "batch": batch,
        "prompts": [c.id for c in picked], "tokens": tokens, "steps": steps,
        "acc_len": round(1 + spec["accepted_tokens"] / spec["drafts"], 3)
        if spec and spec["drafts"] else None,
        "tokens_per_step": round((tokens - len(picked)) / steps, 3) if steps > 0 else None,
        "wall_s": wall, "decode_s": decode_s,
        # Prefill included: the whole profiled stretch's kernels per step.
        "gpu_ms_per_step_by_category": {k: v / max(steps, 1)
                                        for k, v in sorted(by_cat.items())},
        "step": (step_profile(spans, 1000 * decode_s / steps)
                 if steps > 0 and batch == 1 else None),
        # The first call's start to its last first token (batch 8: where
        # fresh prompts' first tokens wait).
        "first_token_s": first_ttft,
        # Each of the first call's first tokens, earliest first: at batch B
        # the cadence at which its prompts start (plain: about a step apart).
        "first_tokens_s": first_ttfts,
        "first_token_window": first_token_window(events, first_ttft),
        # The caching allocator over the profiled calls (in-process engine):
        # a retry frees its cache and synchronises the device.
        "allocator": alloc,
        "scope_spans": spans,
        "scope_kernels": scope_kernels(events),
        "runner_scopes": runner_scopes(prof.key_averages()),
    }
    (args.out_dir / f"profile_{name}.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("mode", "k", "cell", "batch", "steps",
                                             "acc_len", "step", "first_tokens_s",
                                             "allocator")},
                     indent=1))  # noqa: T201
    llm.llm_engine.engine_core.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
