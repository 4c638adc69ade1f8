"""Benchmark the Triton per-KV-block LSE kernel (retrieval/scoring_triton.py).

For each (batch, ctx) it builds a random paged KV cache (every row holds ctx tokens in
randomly permuted cache blocks), checks block_lse_triton against an fp32 torch reference
once, then times the launcher with CUDA events (warm-up excluded, L2 flushed before each
timed launch, median of --iters) and reports achieved GB/s of K bytes read
(batch * ctx * Hkv * head_size * elem_size).

    python -m benchmarks.decode.bench_scoring --ctx 4096 32768 --batch 1 8 \\
        --out bench.json
"""

import argparse
import json
import os
import statistics

import torch
import triton

from benchmarks.harness.meta import run_metadata
from vllm_specextend.retrieval import scoring_triton

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def torch_reference(q, kv, bt, cl, num_blocks, scale):
    """fp32 gather + einsum + masked logsumexp, one row at a time to bound memory."""
    R, hq, d = q.shape
    _, hkv, bs, _ = kv.shape
    tok = (torch.arange(num_blocks, device=q.device)[:, None] * bs
           + torch.arange(bs, device=q.device)[None, :])
    out = []
    for r in range(R):
        k = kv[bt[r, :num_blocks].long()][..., :d].float()  # [nb, Hkv, bs, D]
        s = torch.einsum("hgd,nhtd->hgnt", q[r].float().view(hkv, hq // hkv, d), k) * scale
        s = s.masked_fill(~(tok < cl[r]), float("-inf"))
        out.append(torch.logsumexp(s, dim=-1).reshape(hq, num_blocks))
    return torch.stack(out)


def build_case(batch, ctx, args, dtype, layout, gen):
    bs, hkv, d = args.block_size, args.hkv, args.head_size
    nb = triton.cdiv(ctx, bs)
    n_cache = batch * nb + 1
    shape = (n_cache, bs, hkv, 2 * d) if layout == "nhd" else (n_cache, hkv, bs, 2 * d)
    kv = torch.empty(shape, dtype=dtype, device="cuda").normal_(generator=gen)
    if layout == "nhd":  # vLLM's (B, N, H, 2D) memory order viewed as (B, H, N, 2D)
        kv = kv.permute(0, 2, 1, 3)
    bt = torch.randperm(n_cache, generator=gen, device="cuda")[: batch * nb]
    bt = bt.view(batch, nb).to(torch.int32)
    cl = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(batch, args.hq, d, generator=gen, device="cuda").to(dtype)
    return q, kv, bt, cl, nb


def check(out, ref):
    inf_match = bool(torch.equal(torch.isneginf(out), torch.isneginf(ref)))
    fin = torch.isfinite(ref) & torch.isfinite(out)
    err = (out[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
    return err, inf_match


def time_launcher(fn, iters, warmup, flush):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if flush is not None:
            flush.zero_()  # evict K from L2 so every launch reads HBM
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)  # us
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ctx", type=int, nargs="+", default=[4096, 16384, 32768, 65536])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--layout", choices=["nhd", "hnd"], nargs="+", default=["nhd"])
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-flush-l2", action="store_true", help="time with a warm L2")
    p.add_argument("--tile-rows", type=int, default=None, help="override _TILE_ROWS")
    p.add_argument("--programs-per-sm", type=int, default=None,
                   help="override _PROGRAMS_PER_SM")
    p.add_argument("--out", type=str, default=None, help="write JSON results here")
    args = p.parse_args()

    if args.tile_rows is not None:
        scoring_triton._TILE_ROWS = args.tile_rows
    if args.programs_per_sm is not None:
        scoring_triton._PROGRAMS_PER_SM = args.programs_per_sm
    dtype = DTYPES[args.dtype]
    scale = args.head_size ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    flush = None if args.no_flush_l2 else torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    meta = run_metadata(
        args,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        num_sms=torch.cuda.get_device_properties(0).multi_processor_count,
        tile_rows=scoring_triton._TILE_ROWS,
        programs_per_sm=scoring_triton._PROGRAMS_PER_SM,
        flush_l2=flush is not None,
    )
    results = []
    print(f"{'layout':>6} {'batch':>5} {'ctx':>7} {'median_us':>10} {'min_us':>9} "
          f"{'GB/s':>8} {'max_err':>9} inf_ok")
    for layout in args.layout:
        for batch in args.batch:
            for ctx in args.ctx:
                q, kv, bt, cl, nb = build_case(batch, ctx, args, dtype, layout, gen)
                fn = lambda: scoring_triton.block_lse_triton(q, kv, bt, cl, nb, scale)  # noqa: E731
                err, inf_ok = check(fn(), torch_reference(q, kv, bt, cl, nb, scale))
                times = time_launcher(fn, args.iters, args.warmup, flush)
                med = statistics.median(times)
                k_bytes = batch * ctx * args.hkv * args.head_size * kv.element_size()
                gbps = k_bytes / (med * 1e-6) / 1e9
                row = dict(layout=layout, batch=batch, ctx=ctx, hq=args.hq, hkv=args.hkv,
                           head_size=args.head_size, block_size=args.block_size,
                           dtype=args.dtype, num_blocks=nb, median_us=med, min_us=min(times),
                           mean_us=statistics.fmean(times), iters=args.iters,
                           k_bytes=k_bytes, k_gbps=gbps, max_abs_err=err, inf_match=inf_ok)
                results.append(row)
                print(f"{layout:>6} {batch:>5} {ctx:>7} {med:>10.2f} {min(times):>9.2f} "
                      f"{gbps:>8.1f} {err:>9.2e} {inf_ok}")
                del q, kv, bt, cl
                torch.cuda.empty_cache()

    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=2)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
