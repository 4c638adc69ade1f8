"""The draft's attention over its short view, FA3 (vLLM's bundled
``flash_attn_varlen_func``, called as the captured draft routine calls it:
paged cache through a block table, FA3's ahead-of-time split schedule, vLLM's
split cap under CUDA graphs) against the one-launch Triton prototype in
``view_attention_triton.py``, timed as CUDA-graph replays (issue #26; needs
torch, Triton and vLLM's FA3 on a GPU).

Why it exists: a profile of one 64K, batch-1 step
(``benchmarks/results/decode/20261124T1959Z_h100_profile_spec-extend_64k_b1.txt``)
puts the draft's attention at about 0.9 ms of 16 ms: per layer pass FA3's
main kernel (8.8 µs) and its split combine (3 µs) over a view of about 1.4K
tokens whose bytes take about 1 µs. Before the prototype goes into the plugin,
this measures whether one launch is faster at all. Answer on an H100
(``benchmarks/results/decode/20261127T0027Z_h100_view-attention-microbench.json``):
barely. FA3 runs both kernels in 9.2 µs over 1,408 tokens at batch 1 (the
profile's 8.8 + 3 µs included its gaps), 11.4 µs for 3 new tokens; the
prototype's best (16 splits, 64-token tiles) 9.0 and 8.9 µs: about 50 µs of
a 15.7 ms step. More at 512 tokens (5.7 against 8.2 µs; about 0.2 ms a
step) and at batch 8 (5-22% of the attention, about 70 µs a step at 1,408
tokens).

Shapes are the 1B draft's (32 query heads over 8 KV heads of 64, block size
16); each timing replays a graph of 16 calls over 16 distinct caches (a layer
stack), median of the replays, divided by 16. Query lengths 1 (the draft's
later forwards) and 3 (its first forward at an acceptance of 3 tokens a step).
The outputs of both are compared before any timing.

    python3 -m benchmarks.gpu.view_attention_bench --out out.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from benchmarks.gpu.skinny_gemm_bench import graph_time_us
from benchmarks.gpu.view_attention_triton import ViewAttention
from benchmarks.harness.meta import run_metadata

LAYERS = 16
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 64, 16
FA3_SPLIT_CAP = 32  # vLLM's flash_attn_max_num_splits_for_cuda_graph default


def make_case(num_reqs: int, view_len: int, q_len: int):
    """Per layer a cache, and one block table scattering each request's view
    over it (a view lists chunks from all over the context)."""
    blocks_per_req = -(-view_len // BLOCK_SIZE)
    num_blocks = num_reqs * blocks_per_req * 4
    caches = [(torch.randn(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16,
                           device="cuda"),
               torch.randn(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16,
                           device="cuda")) for _ in range(LAYERS)]
    table = torch.randperm(num_blocks, device="cuda")[:num_reqs * blocks_per_req]
    table = table.view(num_reqs, blocks_per_req).to(torch.int32)
    seq_lens = torch.full((num_reqs,), view_len, dtype=torch.int32, device="cuda")
    starts = torch.arange(0, (num_reqs + 1) * q_len, q_len, dtype=torch.int32, device="cuda")
    q = torch.randn(num_reqs * q_len, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    return q, caches, table, seq_lens, starts


def fa3_calls(q, caches, table, seq_lens, starts, scale, splits: int):
    from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

    q_len, view_len = q.shape[0] // table.shape[0], int(seq_lens.max())
    schedule = get_scheduler_metadata(
        batch_size=table.shape[0], max_seqlen_q=q_len, max_seqlen_k=view_len,
        num_heads_q=HEADS, num_heads_kv=KV_HEADS, headdim=HEAD_DIM,
        cache_seqlens=seq_lens, qkv_dtype=q.dtype, cu_seqlens_q=starts,
        page_size=BLOCK_SIZE, causal=True, num_splits=splits)
    outs = [torch.empty_like(q) for _ in caches]

    def run():
        for (k, v), out in zip(caches, outs):
            flash_attn_varlen_func(
                q=q, k=k, v=v, out=out, cu_seqlens_q=starts, max_seqlen_q=q_len,
                seqused_k=seq_lens, max_seqlen_k=view_len, softmax_scale=scale,
                causal=True, block_table=table, scheduler_metadata=schedule,
                fa_version=3, num_splits=splits)
        return outs
    return run


def triton_calls(q, caches, table, seq_lens, starts, scale, splits: int, block_n: int):
    q_len = q.shape[0] // table.shape[0]
    attn = ViewAttention(table.shape[0], HEADS, KV_HEADS, HEAD_DIM, max_query_len=q_len,
                         num_splits=splits, block_n=block_n)
    outs = [torch.empty_like(q) for _ in caches]

    def run():
        for (k, v), out in zip(caches, outs):
            attn(q, k, v, table, seq_lens, starts, scale, out=out)
        return outs
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--view-lens", type=int, nargs="+", default=[512, 1408, 2048])
    ap.add_argument("--q-lens", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--reqs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--splits", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--block-n", type=int, nargs="+", default=[32, 64])
    args = ap.parse_args()
    torch.manual_seed(0)
    scale = HEAD_DIM ** -0.5
    rows = []
    for reqs, view_len, q_len in itertools.product(args.reqs, args.view_lens, args.q_lens):
        case = make_case(reqs, view_len, q_len)
        row = {"reqs": reqs, "view_len": view_len, "q_len": q_len}
        fa3 = fa3_calls(*case, scale, FA3_SPLIT_CAP)
        want = [o.clone() for o in fa3()]
        row["fa3_us"] = graph_time_us(fa3) / LAYERS
        row["fa3_one_split_us"] = graph_time_us(
            fa3_calls(*case, scale, 1)) / LAYERS
        best = None
        for splits, block_n in itertools.product(args.splits, args.block_n):
            run = triton_calls(*case, scale, splits, block_n)
            got = run()
            err = max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))
            us = graph_time_us(run) / LAYERS
            row[f"triton_s{splits}_n{block_n}_us"] = us
            row[f"triton_s{splits}_n{block_n}_max_err"] = err
            if err < 2e-2 and (best is None or us < best[0]):
                best = (us, f"s{splits}_n{block_n}")
        row["triton_best_us"], row["triton_best"] = best if best else (None, None)
        rows.append(row)
        print(f"reqs {reqs} view {view_len} q {q_len}: FA3 {row['fa3_us']:.2f} us "
              f"(one split {row['fa3_one_split_us']:.2f}), Triton best "
              f"{row['triton_best_us'] and round(row['triton_best_us'], 2)} us "
              f"({row['triton_best']})", flush=True)
    with open(args.out, "w") as f:
        json.dump({"meta": run_metadata(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
