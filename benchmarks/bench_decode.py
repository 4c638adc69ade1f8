"""Decode speed of plain decoding, vLLM speculation, and the same + SpecExtend.

Real model shapes with random weights (``load_format="dummy"``) and vLLM's
synthetic rejection sampler at one fixed acceptance length, so every mode
verifies the same number of tokens per step and only the cost differs. One
engine per (mode, draft); inside it every (context, batch) pair runs on the
same random token prompts. Per run it reports decode tokens/s (after every
request has its first token), the draft's GPU time per step (CUDA events
around ``propose``) and, with SpecExtend, the plugin's scoring time.

``--method`` picks vLLM's speculation (``draft_model``, ``eagle``, ``eagle3``);
the ``draft_model`` entry of ``--modes`` is that method without the plugin, and
its rows record ``mode`` as the method's name. EAGLE-3 heads have 2048
positions: past them vLLM alone never runs the head (``draft_steps`` 0) and
verifies token-0 placeholders, which the synthetic sampler accepts at the set
rate, so that row is the target's speed at that acceptance with no draft cost,
not a drafting baseline (with real rejection sampling, ``acceptance_length`` 1).

    python -m benchmarks.bench_decode --target-config ../shared/gpu/models/llama31_8b \
        --draft-config ../shared/gpu/models/llama_68m --contexts 4096 16384 32768 \
        --batch-sizes 1 8 --out benchmarks/results/decode/<stamp>_h100.json
    python -m benchmarks.bench_decode --target-config ../shared/gpu/models/llama31_8b \
        --draft-config benchmarks/models/configs/llama31_8b_eagle3 --method eagle3 ...

Runs the engine in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) to reach the
drafter; the same setting is used for every mode.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# Every mode on the V1 runner, which --spec-extend needs: vLLM 0.26 would run
# EAGLE alone on V2 (dense models), so the comparison would mix runners.
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")

from benchmarks.harness import drafter as access  # noqa: E402
from benchmarks.harness.meta import run_metadata  # noqa: E402
from benchmarks.longinput.acceptance import counter_delta, spec_counters  # noqa: E402


def model_dir(config_dir: str, root: Path) -> str:
    """A checkpoint dir holding only config.json: enough for dummy weights."""
    out = root / Path(config_dir).name
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(config_dir) / "config.json", out / "config.json")
    return str(out)


def _prompt_index(request_id: str) -> int:
    # vLLM may suffix the id given to add_request.
    return int(request_id.split("-")[0])


def run_once(llm, prompts, output_len, timer):
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    first: dict[str, float] = {}
    tokens: dict[str, int] = {}
    finished: dict[str, list[int]] = {}
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    decode_start = None
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            n = len(out.outputs[0].token_ids)
            if n and out.request_id not in first:
                first[out.request_id] = now
            tokens[out.request_id] = n
            if out.finished:
                finished[out.request_id] = list(out.outputs[0].token_ids)
        if decode_start is None and len(first) == len(prompts):
            decode_start = now
            if timer is not None:
                timer.take_ms()
                timer.enabled = True
    end = time.perf_counter()
    if timer is not None:
        timer.enabled = False
    decode_tokens = sum(tokens.values()) - len(prompts)
    return {
        "prefill_s": decode_start - start,
        "decode_s": end - decode_start,
        "decode_tokens": decode_tokens,
        "decode_tok_s": decode_tokens / (end - decode_start),
        "draft_ms": timer.take_ms() if timer is not None else [],
        # Same prompts and greedy: equal digests mean token-identical outputs
        # (with real rejection sampling, i.e. --acceptance-length 0).
        "output_sha256": hashlib.sha256(
            json.dumps([finished[k] for k in sorted(finished, key=_prompt_index)]).encode()
        ).hexdigest(),
    }


def build_llm(args, mode, target, draft, max_len):
    from vllm import LLM

    kwargs = dict(
        model=target,
        load_format=args.load_format,
        skip_tokenizer_init=True,
        dtype=args.dtype,
        max_model_len=max_len,
        max_num_seqs=max(args.batch_sizes),
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        block_size=args.block_size,
        enable_prefix_caching=False,
        enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size,
        distributed_executor_backend=args.distributed_executor_backend,
        seed=0,
        disable_log_stats=False,
        # Verification batches are at most batch * (K + 1) tokens: capture only those.
        compilation_config={
            "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32, 40, 48, 64],
            **json.loads(args.compilation_config),
        },
    )
    if args.kv_cache_memory_bytes:
        kwargs["kv_cache_memory_bytes"] = args.kv_cache_memory_bytes
    if mode != "plain":
        kwargs["speculative_config"] = {
            "method": args.method,
            "model": draft,
            "num_speculative_tokens": args.num_spec_tokens,
        }
        if args.acceptance_length > 0:
            kwargs["speculative_config"].update(
                rejection_sample_method="synthetic",
                synthetic_acceptance_length=args.acceptance_length,
            )
    if mode == "spec_extend":
        kwargs["additional_config"] = {"spec_extend": json.loads(args.spec_extend)}
    return LLM(**kwargs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-config", required=True)
    parser.add_argument("--draft-config", nargs="+", required=True)
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["plain", "draft_model", "spec_extend"],
        help="draft_model: --method without the plugin",
    )
    parser.add_argument(
        "--method", choices=["draft_model", "eagle", "eagle3"], default="draft_model"
    )
    parser.add_argument("--contexts", nargs="+", type=int, default=[4096, 16384, 32768])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-spec-tokens", type=int, default=4)
    parser.add_argument(
        "--acceptance-length",
        type=float,
        default=3.0,
        help="synthetic mean acceptance length; 0: real rejection sampling (CPU)",
    )
    parser.add_argument("--spec-extend", default='{"top_k": 32, "recent_tokens": 256}')
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=16384)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--kv-cache-memory-bytes", type=int, help="CPU runs")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument(
        "--load-format", default="dummy", help="'auto': the config dirs are checkpoints"
    )
    parser.add_argument("--distributed-executor-backend", choices=["mp", "ray"])
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--compilation-config", default="{}", metavar="JSON", help="merged into the default"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--profile", action="store_true", help="also write a torch.profiler table"
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", help=argparse.SUPPRESS)  # MODE:DRAFT_INDEX, internal
    args = parser.parse_args()
    engines = [("plain", -1)] if "plain" in args.modes else []
    engines += [
        (m, i) for i in range(len(args.draft_config)) for m in args.modes if m != "plain"
    ]
    if args.only is None:
        # One process per engine: an in-process engine does not give all of its
        # GPU memory back, and each engine must start from the same state.
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": run_metadata(args), "results": []},
                                  indent=1))
        failed = 0
        for mode, index in engines:
            cmd = [sys.executable, "-m", "benchmarks.bench_decode", *sys.argv[1:],
                   "--only", f"{mode}:{index}"]
            failed += subprocess.run(cmd).returncode != 0
        return 1 if failed else 0
    mode, index = args.only.split(":")
    run_engine(args, mode, int(index))
    return 0


def run_engine(args, mode: str, index: int) -> None:

    root = Path(tempfile.mkdtemp(prefix="bench-models-"))
    # Dummy weights differ with the TP degree (each rank draws its own shard),
    # so comparing outputs across TP degrees needs real checkpoints.
    dirs = [args.target_config] + ([args.draft_config[index]] if index >= 0 else [None])
    if args.load_format == "dummy":
        dirs = [d and model_dir(d, root) for d in dirs]
    target, draft = dirs
    # The no-plugin mode is named after its method, so eagle3 rows say eagle3.
    label = args.method if mode == "draft_model" else mode
    max_len = max(args.contexts) + args.output_len + 64
    vocab = json.loads(Path(target, "config.json").read_text())["vocab_size"]
    rng = random.Random(args.seed)
    prompts = {
        (ctx, bs): [[rng.randrange(3, vocab) for _ in range(ctx)] for _ in range(bs)]
        for ctx in args.contexts
        for bs in args.batch_sizes
    }
    out = Path(args.out)
    t0 = time.perf_counter()
    llm = build_llm(args, mode, target, draft, max_len)
    startup = time.perf_counter() - t0
    # The drafter is reachable in-process only without worker processes.
    local = args.distributed_executor_backend is None and args.tensor_parallel_size == 1
    timer = (access.ProposeTimer(access.drafter(llm))
             if mode != "plain" and local else None)
    host = (access.HostTimer(access.drafter(llm))
            if mode == "spec_extend" and local else None)
    if host is not None:
        host.enabled = True
    # Warm-up at every batch size: kernels compiled for a new shape (Triton JIT)
    # would otherwise land in the first measured row of that size.
    for bs in args.batch_sizes:
        run_once(llm, prompts[(args.contexts[0], bs)], 8, timer)
    for (ctx, bs), batch in prompts.items():
        before = (access.worker_state(llm)[0]["stats"]
                  if mode == "spec_extend" else None)
        counts = spec_counters(llm)
        row = run_once(llm, batch, args.output_len, timer)
        # Placeholder drafts (vLLM past the draft's length) count here too.
        spec = counter_delta(counts, spec_counters(llm))
        drafts, accepted = spec["drafts"], spec["accepted_tokens"]
        draft_ms = row.pop("draft_ms")
        row.update(
            mode=label,
            method=args.method if draft else None,
            draft=Path(draft).name if draft else None,
            context=ctx,
            batch=bs,
            tensor_parallel_size=args.tensor_parallel_size,
            executor=args.distributed_executor_backend,
            engine_startup_s=startup,
            draft_step_ms_median=statistics.median(draft_ms) if draft_ms else None,
            draft_steps=len(draft_ms),
            # Worker processes (TP, Ray) keep the drafter out of this one's reach.
            draft_timed=timer is not None,
            acceptance_length=1 + accepted / drafts if drafts else None,
        )
        if before is not None:
            delta = access.stats_delta(before, access.worker_state(llm)[0]["stats"])
            row["spec_extend"] = delta
            row["scoring_share_of_decode"] = delta["scoring_seconds"] / row["decode_s"]
        if host is not None:
            row["prepare_view_cpu_ms_median"] = statistics.median(
                host.take_ms() or [0.0])
        print(json.dumps(row), flush=True)
        result = json.loads(out.read_text())
        result["results"].append(row)
        out.write_text(json.dumps(result, indent=1))
    if args.profile:
        profile(llm, prompts[(args.contexts[0], max(args.batch_sizes))], out, label)


def profile(llm, batch, out: Path, mode: str) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_once(llm, batch, 32, None)
    table = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=30)
    table += "\n" + prof.key_averages().table(sort_by="cpu_time_total", row_limit=40)
    out.with_name(f"{out.stem}_profile_{mode}.txt").write_text(table)


if __name__ == "__main__":
    sys.exit(main())
