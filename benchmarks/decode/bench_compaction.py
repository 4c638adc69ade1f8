"""Cost of one compaction: copying a request's sink and chunk blocks into its
scratch blocks and re-rotating the copied keys (``scratch.copy_shifted``).

The KV caches have the draft's layout ([num_blocks, Hkv, bs, 2 * D], keys in the
first half of each page); on CPU the keys go through a page permutation as
vLLM's CPU attention stores them. Times one call per request (median of
--iters, warm-up excluded; CUDA synchronised around each call).

    python -m benchmarks.decode.bench_compaction \
        --out benchmarks/results/compaction/<stamp>.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from benchmarks.harness.meta import run_metadata
from vllm_specextend.drafting.scratch import copy_shifted

# (name, layers, kv heads, head size): the tiny test draft, the 2-layer 68M
# draft and Llama-3.2-1B.
SHAPES = [("tiny", 1, 2, 32), ("llama_68m", 2, 12, 64), ("llama32_1b", 16, 8, 64)]


def time_one(layers, heads, head_size, blocks, block_size, device, dtype, iters):
    pool = 4 * blocks
    caches = [
        torch.randn(pool + blocks, heads, block_size, 2 * head_size,
                    device=device, dtype=dtype)
        for _ in range(layers)
    ]
    order = torch.randperm(block_size * head_size) if device == "cpu" else None
    orders = [order] * layers
    src = torch.randperm(pool, device=device)[:blocks]
    dst = torch.arange(pool, pool + blocks, device=device)
    delta = torch.randint(0, 32768, (blocks,), device=device)
    inv_freq = 1.0 / 500000 ** (torch.arange(0, head_size, 2, device=device) / head_size)
    times = []
    for i in range(iters + 3):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        copy_shifted(caches, orders, src, dst, delta, inv_freq, True, head_size)
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 3:
            times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top-k", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--chunk-size", type=int, default=32)
    parser.add_argument("--sink-tokens", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    rows = []
    for name, layers, heads, head_size in SHAPES:
        for top_k in args.top_k:
            tokens = args.sink_tokens + top_k * args.chunk_size
            blocks = tokens // args.block_size
            ms = time_one(layers, heads, head_size, blocks, args.block_size,
                          device, dtype, args.iters)
            row = dict(draft=name, layers=layers, kv_heads=heads, head_size=head_size,
                       top_k=top_k, tokens=tokens, blocks=blocks, ms_per_request=ms)
            print(json.dumps(row), flush=True)
            rows.append(row)
    meta = run_metadata(args, torch_threads=torch.get_num_threads())
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
