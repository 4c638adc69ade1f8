"""Decode speed of plain decoding, vLLM's speculation and SpecExtend, driven as
users drive vLLM: ``LLM(...).generate`` with vLLM's defaults (its engine core
in its own process), one engine per mode, run one after another.

Real model shapes with random weights (``load_format="dummy"``, config dirs
holding only ``config.json``) and vLLM's synthetic rejection sampler at one
fixed acceptance length (``--acceptance-length``, 0: real rejection sampling),
so every speculative mode verifies the same number of tokens per step and
only the cost differs. For every (context, batch) cell each engine first runs
a warm-up at that shape, then ``--runs`` timed runs.

Prompts are random tokens, the same in every mode (greedy digests compare
across modes with real rejection sampling). By default every run gets prompts
of its own: each prompt of a cell (the warm-up's and every run's, every
request's) starts with a token no other of them starts with, so vLLM's prefix
cache (left on, as vLLM defaults it) holds no block of them and each run pays
its target prefill and the draft's pass over its prompts, as a user sending a
new document does; each run records ``num_cached_tokens`` (0 then; a warning
says otherwise). ``--cached-prompt`` reuses the warm-up's prompts in every
timed run instead, as files with ``"fresh_prompts": false`` did: the prefix
cache serves them (``num_cached_tokens``: all but the last partial block), so
the prefill is paid once per cell, in the warm-up, and no run's figure holds
it. Results say which: ``"fresh_prompts"`` in the config and in every result
row. A cell whose batch does not fit the KV
cache is skipped and says so.

Per run:

- ``decode_tok_s``: output tokens after each request's first token over the
  time some request was past its first token (the union of the requests'
  [first token, last token] windows, from the ``RequestOutput.metrics``
  timestamps of vLLM's engine core; ``benchmarks.harness.measure``). The
  first request's prefill is outside it; at batch > 1 the later requests'
  prefill chunks can fall inside it, and so do the draft's passes over a
  prompt that a mode defers past the first token (SpecExtend's deferral).
- ``ttft_s``: time to first token, the longest of the run's requests' (batch
  1: the request's), as vLLM's ``RequestOutput.metrics.first_token_latency``
  gives it (from the request's arrival in the engine's front end to the front
  end's handling of its first token: queueing, the target's prefill, and the
  draft's pass over the prompt where a mode runs it before the first token);
  ``ttft_s_median`` is the median over the requests.
- ``e2e_tok_s``: all output tokens over the whole ``generate`` call
  (``e2e_s``, the requests' submission, prefill, the draft's pass over the
  prompts and decoding), the figure a user waiting for the batch sees.
- the GPU busy share over the decode window (NVML,
  ``benchmarks.harness.gpu_busy``), acceptance length (vLLM's spec-decode
  counters), the output digest, and in the plugin's modes the deltas of the
  plugin's counters and seconds from every worker
  (``collective_rpc("specextend_state")``).

Per cell: min / median / max over the runs of ``decode_tok_s``, ``e2e_tok_s``
and ``ttft_s``. ``--draft-timing`` also times every ``propose`` (and
SpecExtend's per-step view preparation) inside the workers; it ships the
timers there with ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``.

Modes (``benchmarks.harness.modes``): ``plain``, ``draft_model`` (``--method``
without the plugin; its rows say the method's name), ``spec_extend`` and
``self_draft`` (the target drafting for itself; no draft model). The result
file's ``engines`` list says, per engine, every setting this script changed
from vLLM's defaults, the environment, whether vLLM turned async scheduling on,
its start-up time and KV cache capacity.

    python -m benchmarks.decode.bench_decode \\
        --target-config ../shared/gpu/models/llama31_8b \\
        --draft-config ../shared/gpu/models/llama32_1b --contexts 4096 32768 \\
        --batch-sizes 1 8 --out benchmarks/results/decode/<stamp>_h100_8b-1b.json

EAGLE-3 heads have 2048 positions: past them vLLM alone never runs the head
and verifies token-0 placeholders, which the synthetic sampler accepts at the
set rate, so that row is the target's speed at that acceptance with no draft
cost, not a drafting baseline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import drafter as access
from benchmarks.harness import modes
from benchmarks.harness.gpu_busy import GpuBusy
from benchmarks.harness.measure import decode_throughput, spread
from benchmarks.harness.meta import SPEED_SPEC_EXTEND, plugin_env, run_metadata
from benchmarks.longinput.acceptance import counter_delta, spec_counters

DEFAULT_SPEC_EXTEND = json.dumps(SPEED_SPEC_EXTEND)


def model_dir(config_dir: str, root: Path) -> str:
    """A checkpoint dir holding only config.json: enough for dummy weights."""
    out = root / Path(config_dir).name
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(config_dir) / "config.json", out / "config.json")
    return str(out)


def prompts_for(vocab: int, seed: int, context: int, batch: int,
                run: int) -> list[list[int]]:
    """Random-token prompts of one cell (``run``: -1 for the warm-up of fresh
    prompts), the same in every mode."""
    rng = random.Random(f"{seed}:{context}:{batch}:{run}")
    return [[rng.randrange(3, vocab) for _ in range(context)] for _ in range(batch)]


def cell_prompts(vocab: int, seed: int, context: int, batch: int, runs: int,
                 fresh: bool) -> tuple[list[list[int]], list[list[list[int]]]]:
    """(the warm-up's prompts, each timed run's) of one cell, the same in every
    mode. ``fresh``: every prompt of the cell, the warm-up's and every run's,
    starts with a token of its own, so none shares a prefix-cache block with
    another; else every run reuses the warm-up's prompts."""
    if not fresh:
        warm = prompts_for(vocab, seed, context, batch, 0)
        return warm, [warm] * runs
    sets = [prompts_for(vocab, seed, context, batch, run) for run in range(-1, runs)]
    n = len(sets) * batch
    if n > vocab - 3:
        raise ValueError(f"{n} fresh prompts need as many first tokens; the "
                         f"vocabulary has {vocab - 3} (fewer runs, or --cached-prompt)")
    firsts = random.Random(f"{seed}:{context}:{batch}:first").sample(range(3, vocab), n)
    for prompt, first in zip((p for s in sets for p in s), firsts, strict=True):
        prompt[0] = first
    return sets[0], sets[1:]


def engine_args(args, mode: str, target: str, draft: str | None) -> dict:
    """The ``LLM`` keyword arguments of one engine: the ones every mode shares
    (only those this script or the command line changes), then the mode's."""
    kwargs: dict = dict(
        model=target,
        max_model_len=max(args.contexts) + args.output_len + args.num_spec_tokens + 16,
        # RequestOutput.metrics (first/last token times) and the spec-decode
        # counters exist only with stats on.
        disable_log_stats=False,
    )
    if args.load_format != "auto":
        kwargs["load_format"] = args.load_format
    if args.load_format == "dummy":
        kwargs["skip_tokenizer_init"] = True  # config.json only; token ids in
    optional = {
        "dtype": args.dtype, "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "kv_cache_memory_bytes": args.kv_cache_memory_bytes,
        "block_size": args.block_size,
        "tensor_parallel_size": args.tensor_parallel_size,
        "distributed_executor_backend": args.distributed_executor_backend,
        "async_scheduling": args.async_scheduling,
    }
    kwargs.update({k: v for k, v in optional.items() if v is not None})
    if args.enforce_eager:
        kwargs["enforce_eager"] = True
    if args.compilation_config:
        kwargs["compilation_config"] = json.loads(args.compilation_config)
    spec = modes.Speculation(draft=draft, method=args.method,
                             num_spec_tokens=args.num_spec_tokens,
                             acceptance_length=args.acceptance_length,
                             spec_extend=json.loads(args.spec_extend))
    kwargs.update(modes.engine_settings(mode, spec))
    return kwargs


def engine_env(args, mode: str) -> dict:
    """Environment this script sets for an engine."""
    env = {}
    if args.method in ("eagle", "eagle3") and args.eagle_v1_baseline:
        # vLLM 0.26 runs EAGLE alone on its V2 runner (dense models), the plugin
        # on V1 (it sets that itself): a baseline on V1 too, on request.
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if args.draft_timing and mode != "plain":
        env.update(access.WORKER_TIMING_ENV)
    return env


def generate(llm, prompts: list[list[int]], output_len: int, gpus: int = 1) -> dict:
    """One batch to completion; the run's figures (``run_figures``) and the
    GPU busy share of its decode window, of each of the engine's ``gpus``
    (tensor parallel) and their mean."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    with GpuBusy(range(gpus)) as busy:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                               use_tqdm=False)
    run = run_figures(outputs, time.perf_counter() - start)
    # Share of the decode window during which a kernel ran (NVML), per GPU.
    per_gpu = busy.per_device([(o.metrics.first_token_ts, o.metrics.last_token_ts)
                               for o in outputs])
    run["gpu_busy"] = None if per_gpu is None else sum(per_gpu) / len(per_gpu)
    if per_gpu is not None and gpus > 1:
        run.update(gpu_busy_per_gpu=per_gpu, gpu_busy_min=min(per_gpu))
    return run


def run_figures(outputs, e2e_s: float) -> dict:
    """A run's figures (the module docstring says what each holds) from its
    ``RequestOutput``s, whose ``metrics`` vLLM fills in with stats on, and
    ``e2e_s``, the wall time of the ``generate`` call."""
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    stats = [o.metrics for o in outputs]
    if any(s is None or not s.first_token_ts for s in stats):
        raise RuntimeError("RequestOutput.metrics is empty: the engine needs "
                           "disable_log_stats=False")
    decode = decode_throughput((s.first_token_ts, s.last_token_ts, len(t))
                               for s, t in zip(stats, tokens, strict=True))
    output_tokens = sum(map(len, tokens))
    ttft = [s.first_token_latency for s in stats]
    return {
        **decode,
        "num_cached_tokens": sum(o.num_cached_tokens or 0 for o in outputs),
        "e2e_s": e2e_s,
        "output_tokens": output_tokens,
        "e2e_tok_s": output_tokens / e2e_s,
        "ttft_s": max(ttft),
        "ttft_s_median": spread(ttft)["median"],
        # Same prompts and greedy: equal digests mean token-identical outputs
        # (with real rejection sampling, i.e. --acceptance-length 0).
        "output_sha256": hashlib.sha256(json.dumps(tokens).encode()).hexdigest(),
    }


def rank0_state(llm) -> dict | None:
    """Rank 0's ``specextend_state`` (ranks count the same rows), or None on
    an engine without the plugin's worker."""
    try:
        return access.worker_state(llm)[0]
    except Exception:  # any failure means: no plugin worker to answer
        return None


def plugin_state(llm) -> dict | None:
    """Rank 0's SpecExtend counters, or None without the plugin's worker."""
    state = rank0_state(llm)
    return None if state is None else state["stats"]


def kv_cache_tokens(llm) -> int | None:
    cache = llm.llm_engine.vllm_config.cache_config
    if not cache.num_gpu_blocks:
        return None
    return cache.num_gpu_blocks * cache.block_size


def timed_run(llm, prompts, args, plugin: bool, timed: bool) -> dict:
    """One timed run; ``plugin``: read the plugin's counters, ``timed``: the
    workers' draft timers."""
    counts = spec_counters(llm)
    before = plugin_state(llm) if plugin else None
    if timed:
        llm.collective_rpc(access.take_worker_timings)  # drop the warm-up's
    run = generate(llm, prompts, args.output_len, args.tensor_parallel_size or 1)
    spec = counter_delta(counts, spec_counters(llm))
    run["acceptance_length"] = (1 + spec["accepted_tokens"] / spec["drafts"]
                                if spec["drafts"] else None)
    if before is not None:
        delta = access.stats_delta(before, plugin_state(llm))
        run["spec_extend"] = delta
        run["scoring_share_of_decode"] = delta["scoring_seconds"] / run["decode_s"]
    if timed:
        timing = llm.collective_rpc(access.take_worker_timings)[0]
        propose, view = timing["propose_ms"], timing["prepare_view_ms"]
        run["draft_steps"] = len(propose)
        run["draft_step_ms_median"] = spread(propose)["median"]
        if view:
            run["prepare_view_cpu_ms_median"] = spread(view)["median"]
    return run


def run_engine(args, mode: str, index: int, out: Path) -> int:
    from vllm import LLM

    spec = modes.Speculation(method=args.method)
    label = modes.label(mode, spec)
    draft_config = args.draft_config[index] if index >= 0 else None
    root = Path(tempfile.mkdtemp(prefix="bench-models-"))
    target, draft = args.target_config, draft_config
    if args.load_format == "dummy":
        target = model_dir(target, root)
        draft = draft and model_dir(draft, root)
    vocab = json.loads(Path(target, "config.json").read_text())["vocab_size"]
    kwargs = engine_args(args, mode, target, draft)
    env = engine_env(args, mode)
    os.environ.update(env)
    # The copies' paths are temporary: record the config dirs given.
    shown = json.dumps(kwargs).replace(str(root / Path(args.target_config).name),
                                       args.target_config)
    if draft_config:
        shown = shown.replace(str(root / Path(draft_config).name), draft_config)
    engine = {"mode": label, "draft": draft and Path(draft).name,
              "engine_args": json.loads(shown), "env_set": env,
              "vllm_env": {k: v for k, v in os.environ.items()
                           if k.startswith("VLLM_")},
              "plugin_env": plugin_env()}
    start = time.perf_counter()
    try:
        llm = LLM(**kwargs)
    except Exception as e:
        # Recorded; the parent goes on with the next engine.
        append(out, "engines", {**engine, "error": f"{type(e).__name__}: {e}",
                                "ended_children": ended_children()})
        raise
    # Asked only where the plugin was requested: elsewhere the RPC fails in the
    # engine, which logs it as an error with a traceback.
    requested = "spec_extend" in (llm.llm_engine.vllm_config.additional_config or {})
    state = rank0_state(llm) if requested else None
    plugin = state is not None
    engine.update(
        startup_s=time.perf_counter() - start,
        async_scheduling=llm.llm_engine.vllm_config.scheduler_config.async_scheduling,
        kv_cache_tokens=kv_cache_tokens(llm),
        plugin_active=plugin,
    )
    if plugin and (args.tensor_parallel_size or 1) > 1:
        # As the engine resolved it (``draft_placement: auto``).
        engine["draft_placement"] = state.get("draft_placement")
    if plugin:  # as the engine resolved it (``"auto"`` per engine; null stays)
        engine["draft_prompt_pool"] = state.get("draft_prompt_pool")
    append(out, "engines", engine)
    timed = args.draft_timing and mode != "plain"
    if timed:
        llm.collective_rpc(access.install_worker_timers)
    capacity = engine["kv_cache_tokens"]
    for context in args.contexts:
        for batch in args.batch_sizes:
            row = {"mode": label, "method": args.method if mode != "plain" else None,
                   "draft": engine["draft"], "context": context, "batch": batch,
                   "output_len": args.output_len,
                   "tensor_parallel_size": args.tensor_parallel_size,
                   "fresh_prompts": args.fresh_prompts}
            need = batch * (context + args.output_len + args.num_spec_tokens)
            if capacity is not None and need > capacity:
                append(out, "results", {**row, "skipped": (
                    f"{batch} x {context}-token requests need {need} KV tokens, "
                    f"the cache holds {capacity}")})
                continue
            # Warm-up at this shape: kernels compiled or captured for a new
            # batch size or length land here, not in a timed run.
            warm_set, run_sets = cell_prompts(vocab, args.seed, context, batch,
                                              args.runs, args.fresh_prompts)
            warm = generate(llm, warm_set, args.warmup_len)
            runs = [timed_run(llm, prompts, args, plugin, timed)
                    for prompts in run_sets]
            cached = [r["num_cached_tokens"] for r in runs]
            if args.fresh_prompts and any(cached):
                warning = (f"warning: {label} {context} x {batch}: fresh prompts, "
                           f"yet the prefix cache served {cached} tokens")
                print(warning, file=sys.stderr)  # noqa: T201
            row.update(warmup_e2e_s=warm["e2e_s"], runs=runs,
                       decode_tok_s=spread([r["decode_tok_s"] for r in runs]),
                       gpu_busy=[r["gpu_busy"] for r in runs],
                       e2e_tok_s=spread([r["e2e_tok_s"] for r in runs]),
                       ttft_s=spread([r["ttft_s"] for r in runs]))
            print(json.dumps({k: v for k, v in row.items() if k != "runs"}),  # noqa: T201
                  flush=True)
            append(out, "results", row)
    llm.llm_engine.engine_core.shutdown()
    shutil.rmtree(root, ignore_errors=True)
    return 0


def ended_children(wait_s: float = 5.0) -> list[str]:
    """How the processes this one started ended (an engine core that died
    during start-up: vLLM reports ``Failed core proc(s): {}`` when it looks
    before the exit status is in): name, pid, and the signal that ended one
    or its exit code. vLLM's shutdown joins its processes before the error
    reaches here, which drops them from ``multiprocessing``'s own list; the
    error's traceback still holds vLLM's process manager, so they are found
    among the live objects."""
    import gc
    import multiprocessing.process
    import signal
    import warnings

    with warnings.catch_warnings():
        # isinstance reads each object's __class__, on which some deprecated
        # objects warn (torch.distributed.reduce_op).
        warnings.simplefilter("ignore")
        processes = [o for o in gc.get_objects()
                     if isinstance(o, multiprocessing.process.BaseProcess)]
    ended = []
    for child in processes:
        if (child._popen is None  # never started (or this process)
                or child._parent_pid != os.getpid()):
            continue
        child.join(wait_s)
        code = child.exitcode
        how = ("running" if code is None else f"killed by {signal.Signals(-code).name}"
               if code < 0 else f"exit code {code}")
        ended.append(f"{child.name} (pid {child.pid}): {how}")
    return ended


def append(out: Path, key: str, item: dict) -> None:
    """Add to the result file as soon as there is something (a run cut short
    keeps what it finished)."""
    result = json.loads(out.read_text())
    result.setdefault(key, []).append(item)
    out.write_text(json.dumps(result, indent=1))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--target-config", required=True)
    p.add_argument("--draft-config", nargs="+", default=[],
                   help="one engine per draft in the draft_model and spec_extend modes")
    p.add_argument("--modes", nargs="+", choices=modes.MODES,
                   default=["plain", "draft_model", "spec_extend"])
    p.add_argument("--method", choices=modes.METHODS, default="draft_model")
    p.add_argument("--contexts", nargs="+", type=int,
                   default=[4096, 16384, 32768, 65536])
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8])
    p.add_argument("--runs", type=int, default=3, help="timed runs per cell")
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--warmup-len", type=int, default=16,
                   help="output tokens of the warm-up run at each shape")
    prompts = p.add_mutually_exclusive_group()
    prompts.add_argument("--fresh-prompts", dest="fresh_prompts", action="store_true",
                         default=True,
                         help="the default: new prompts for the warm-up and every "
                              "run, none cached (each run pays its prefill)")
    prompts.add_argument("--cached-prompt", dest="fresh_prompts", action="store_false",
                         help="every run reuses the warm-up's prompts, served by "
                              "the prefix cache (no prefill in any run's figures)")
    p.add_argument("--num-spec-tokens", type=int, default=4)
    p.add_argument("--acceptance-length", type=float, default=3.0,
                   help="synthetic mean acceptance length; 0: real rejection sampling")
    p.add_argument("--spec-extend", default=DEFAULT_SPEC_EXTEND, metavar="JSON",
                   help="the plugin's config in the spec_extend and self_draft modes")
    p.add_argument("--load-format", default="dummy",
                   help="'auto': the config dirs are checkpoints")
    p.add_argument("--eagle-v1-baseline", action="store_true",
                   help="run vLLM's own EAGLE on the V1 runner, as the plugin; "
                        "default: vLLM's choice (V2 for dense models)")
    p.add_argument("--draft-timing", action="store_true",
                   help="time propose() in the workers (insecure serialization)")
    p.add_argument("--start-retries", type=int, default=0, metavar="N",
                   help="start an engine again, up to N times, when it fails to "
                        "start (a transient failure of a loaded host); each "
                        "failed start stays in the file's engines with its error")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("engine settings (default: vLLM's)")
    g.add_argument("--dtype")
    g.add_argument("--max-num-seqs", type=int)
    g.add_argument("--max-num-batched-tokens", type=int)
    g.add_argument("--gpu-memory-utilization", type=float)
    g.add_argument("--kv-cache-memory-bytes", type=int)
    g.add_argument("--block-size", type=int)
    g.add_argument("--tensor-parallel-size", type=int)
    g.add_argument("--distributed-executor-backend", choices=["mp", "ray"])
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                   default=None)
    g.add_argument("--enforce-eager", action="store_true")
    g.add_argument("--compilation-config", metavar="JSON")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--only", help=argparse.SUPPRESS)  # MODE:DRAFT_INDEX, internal
    args = p.parse_args(argv)
    if args.start_retries < 0:
        p.error("--start-retries takes 0 or more")
    if set(args.modes) & {"draft_model", "spec_extend"} and not args.draft_config:
        p.error("--draft-config is needed by the draft_model and spec_extend modes")
    if gap := modes.plugin_gap(args.modes):
        p.error(gap)
    return args


def engines(args) -> list[tuple[str, int]]:
    """(mode, draft index) in order; -1: no draft."""
    out = []
    for mode in args.modes:
        if modes.needs_draft(mode):
            out += [(mode, i) for i in range(len(args.draft_config))]
        else:
            out.append((mode, -1))
    return out


START_FAILED = "bench_decode: an engine failed to start"
"""Printed after each failed start, before a retry's log."""


def failed_starts(out: Path) -> int:
    """Engines in ``out`` that failed to start (``run_engine`` records each)."""
    return sum("error" in e for e in json.loads(out.read_text())["engines"])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.only is not None:
        mode, index = args.only.split(":")
        return run_engine(args, mode, int(index), args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(
        {"meta": run_metadata(args, bench="decode"), "engines": [], "results": []},
        indent=1))
    # One process per engine: each starts from the same state, and a mode that
    # fails (self_draft before the plugin has it) does not stop the others.
    failed = []
    for mode, index in engines(args):
        cmd = [sys.executable, "-m", "benchmarks.decode.bench_decode",
               *(argv if argv is not None else sys.argv[1:]),
               "--only", f"{mode}:{index}"]
        for attempt in range(1, args.start_retries + 2):
            starts_failed = failed_starts(args.out)
            if subprocess.run(cmd).returncode == 0:
                break
            if failed_starts(args.out) == starts_failed:
                # Failed after its start (or died before it recorded one).
                failed.append(f"{mode}:{index}")
                break
            # On both streams: vLLM logs to stdout, Python's faults to stderr.
            for stream in (sys.stdout, sys.stderr):
                print(f"{START_FAILED} ({mode}:{index}, attempt {attempt} of "
                      f"{args.start_retries + 1})", file=stream, flush=True)  # noqa: T201
        else:
            failed.append(f"{mode}:{index}")
    from benchmarks.decode.summarize_decode import table

    print(table(json.loads(args.out.read_text())))  # noqa: T201
    if failed:
        print(f"engines that failed: {', '.join(failed)}", file=sys.stderr)  # noqa: T201
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
