"""The draft's GEMMs at 1 and 5 rows: cuBLAS (``F.linear``) against a Triton
kernel written for few rows, timed as CUDA-graph replays (needs only torch and
Triton; no vLLM).

Why it exists: the 64K batch-1 profile (``benchmarks/results/decode/
20261124T1959Z_h100_profile_spec-extend_64k_b1.txt``) put about 4.1 ms of a
15.5 ms step in the 1B draft's GEMMs, against 2.3 ms of weight bytes at the
datasheet bandwidth. This measures whether a kernel of our own could take that
back. Answer on an H100 (``benchmarks/results/decode/
20261125T1929Z_h100_draft-gemm-microbench.json``): no. cuBLAS runs the 16-layer
stack within 6% of the card's measured copy bandwidth (0.86 ms a forward, 3.4 ms
for the step's four, against the profile's 4.1) and the Triton kernel is 4%
slower.

Shapes are the 1B draft's (Llama-3.2-1B: hidden 2048, 32/8 heads of 64,
intermediate 8192): qkv, o, gate_up, down. Each timing replays a graph of 16
products over 16 distinct weights (a layer stack, so no weight stays in L2),
median of the replays, divided by 16. The floor is the weight bytes over the
copy bandwidth measured here. A last table times the whole 16-layer stack
(4 products per layer) both ways.

    python3 -m benchmarks.gpu.skinny_gemm_bench --out out.json
"""

import argparse
import itertools
import json
import statistics

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 16
"""Rows a launch serves (one tensor-core tile). Past it cuBLAS is the right tool."""


@triton.jit(do_not_specialize=["M"])
def _skinny_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    rm = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    rk = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :]
    w_ptrs = w_ptr + rn[:, None] * stride_wn + rk[None, :]
    row_ok = rm[:, None] < M
    col_ok = rn[:, None] < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk[None, :]) < K
        x = tl.load(x_ptrs, mask=row_ok & k_ok, other=0.0)
        w = tl.load(w_ptrs, mask=col_ok & k_ok, other=0.0)
        acc += tl.dot(x, tl.trans(w))
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    y_ptrs = y_ptr + rm[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=row_ok & (rn[None, :] < N))


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, *, block_n: int = 32,
                block_k: int = 256, num_warps: int = 4,
                num_stages: int = 4) -> torch.Tensor:
    """``x`` [M, K], ``w`` [N, K] -> [M, N] in x's dtype; M <= MAX_ROWS."""
    m, k = x.shape
    n = w.shape[0]
    assert m <= MAX_ROWS and w.shape[1] == k and x.stride(1) == 1 and w.stride(1) == 1
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _skinny_kernel[(triton.cdiv(n, block_n),)](
        x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
        BLOCK_M=MAX_ROWS, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages)
    return y


SHAPES = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048),
          "down": (2048, 8192)}
LAYERS = 16
CONFIGS = [dict(block_n=bn, block_k=bk, num_warps=w, num_stages=s)
           for bn, bk, w, s in itertools.product((16, 32, 64, 128), (128, 256, 512),
                                                 (4, 8), (3, 4, 6))]


def graph_time_us(fn, replays: int = 30) -> float:
    fn()  # compile / warm outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    return statistics.median(times)


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = graph_time_us(lambda: dst.copy_(src), replays=10)
    return 2 * src.numel() / (us * 1e-6)  # bytes read + written per second


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 5])
    args = ap.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    weights = {name: [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
                      for _ in range(LAYERS)] for name, (n, k) in SHAPES.items()}
    result = {"device": torch.cuda.get_device_name(), "copy_bw_GBps": bw / 1e9,
              "torch": torch.__version__, "shapes": {}, "stack": {}}
    best = {}
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    print(f"{'shape':8} {'rows':>4} {'floor':>7} {'cublas':>7} {'triton':>7}  config")
    for name, (n, k) in SHAPES.items():
        ws = weights[name]
        floor = n * k * 2 / bw * 1e6
        for m in args.rows:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            ref = F.linear(x.double(), ws[0].double())
            cub = graph_time_us(lambda: [F.linear(x, w) for w in ws]) / LAYERS
            rows = []
            for cfg in CONFIGS:
                try:
                    y = skinny_gemm(x, ws[0], **cfg)
                    err = ((y.double() - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        rows.append((float("inf"), cfg, err))
                        continue
                    us = graph_time_us(lambda: [skinny_gemm(x, w, **cfg) for w in ws]) / LAYERS
                    rows.append((us, cfg, err))
                except Exception as e:  # a config Triton cannot build (shared memory)
                    rows.append((float("inf"), cfg, repr(e)[:80]))
            rows.sort(key=lambda r: r[0])
            us, cfg, err = rows[0]
            best[(name, m)] = cfg
            result["shapes"][f"{name}/{m}"] = {
                "floor_us": floor, "cublas_us": cub, "triton_us": us, "config": cfg,
                "rel_err": err, "top5": [(r[0], r[1]) for r in rows[:5]]}
            print(f"{name:8} {m:>4} {floor:7.1f} {cub:7.1f} {us:7.1f}  {cfg}")
    for m in args.rows:
        x = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")
        h = torch.randn(m, 8192, dtype=torch.bfloat16, device="cuda")

        def stack(gemm):
            def run():
                for i in range(LAYERS):
                    gemm("qkv", x, weights["qkv"][i])
                    gemm("o", x, weights["o"][i])
                    gemm("gate_up", x, weights["gate_up"][i])
                    gemm("down", h, weights["down"][i])
            return run

        cub = graph_time_us(stack(lambda name, a, w: F.linear(a, w)))
        tri = graph_time_us(stack(lambda name, a, w: skinny_gemm(a, w, **best[(name, m)])))
        floor = sum(n * k for n, k in SHAPES.values()) * 2 * LAYERS / bw * 1e6
        result["stack"][str(m)] = {"floor_us": floor, "cublas_us": cub, "triton_us": tri}
        print(f"stack of {LAYERS} layers, {m} rows: floor {floor:.0f} us, "
              f"cublas {cub:.0f} us, triton {tri:.0f} us")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
