"""The draft's GEMMs at 1 and 5 rows: cuBLAS (``F.linear``) against a Triton
kernel written for few rows, timed as CUDA-graph replays (needs only torch and
Triton; no vLLM).

Why it exists: the 64K batch-1 profile (``benchmarks/results/decode/
20261124T1959Z_h100_profile_spec-extend_64k_b1.txt``, kernels attributed by
call count per step) puts about 4.1 ms of a 16.5 ms step in the 1B draft's
GEMMs, against 2.3 ms for their weight bytes at the datasheet bandwidth. This
measures whether a kernel of our own could take that back. Answer on an H100
(``benchmarks/results/decode/20261125T1929Z_h100_draft-gemm-microbench.json``):
not by itself. Alone, cuBLAS runs the 16-layer stack in 858 us at 1 row and
863 us at 5 (about 2.27 TB/s, 6-7% over the weight bytes at the measured copy
rate, a rate cuBLAS beats on gate_up), and the Triton kernel below is 3-4%
slower. The 0.7 ms between the stack alone (3.4 ms for a step's four
forwards) and the profile's 4.1 ms is not explained by this bench.

Shapes are the 1B draft's (Llama-3.2-1B: hidden 2048, 32/8 heads of 64,
intermediate 8192): qkv, o, gate_up, down. Each timing replays a graph of 16
products over 16 distinct weights (a layer stack, so no weight stays in L2),
median of the replays, divided by 16. The floor is the weight bytes over the
read bandwidth measured here (a sum over 1 GiB; the first run, in the file
above, had only the copy rate). A last table times the whole 16-layer stack
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

from benchmarks.harness.meta import run_metadata

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


def bandwidths() -> dict[str, float]:
    """Bytes per second: a 1 GiB copy (read + write counted) and a 1 GiB
    read (a sum), the two ceilings the products are compared with."""
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    out = torch.empty((), dtype=torch.float32, device="cuda")
    nbytes = src.numel() * src.element_size()
    copy_us = graph_time_us(lambda: dst.copy_(src), replays=10)
    read_us = graph_time_us(lambda: torch.sum(src, (0,), dtype=torch.float32, out=out), replays=10)
    return {"copy": 2 * nbytes / (copy_us * 1e-6), "read": nbytes / (read_us * 1e-6)}


def floor_us(nbytes: int, bw: float) -> float:
    return nbytes / bw * 1e6


def best_config(x: torch.Tensor, ws: list[torch.Tensor]) -> tuple[float, dict, float]:
    """The fastest Triton config for x @ w.T over the layer stack ``ws``:
    (microseconds per product, config, relative error). A config that is
    wrong or that Triton cannot build (shared memory) is left out."""
    ref = F.linear(x.double(), ws[0].double())
    found = []
    for cfg in CONFIGS:
        try:
            y = skinny_gemm(x, ws[0], **cfg)
        except Exception:  # noqa: BLE001 - Triton's build errors have no common type
            continue
        err = ((y.double() - ref).norm() / ref.norm()).item()
        if err < 1e-2:
            us = graph_time_us(lambda cfg=cfg: [skinny_gemm(x, w, **cfg) for w in ws])
            found.append((us / LAYERS, cfg, err))
    if not found:
        raise RuntimeError(f"no Triton config computes {tuple(x.shape)} @ "
                           f"{tuple(ws[0].shape)}.T correctly")
    return min(found, key=lambda f: f[0])


def time_shapes(weights: dict, rows: list[int], bw: float) -> tuple[dict, dict]:
    """Each shape alone: cuBLAS and the best Triton config per row count."""
    table, best = {}, {}
    print(f"{'shape':8} {'rows':>4} {'floor':>7} {'cublas':>7} {'triton':>7}  config")
    for name, (n, k) in SHAPES.items():
        ws = weights[name]
        for m in rows:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            cub = graph_time_us(lambda: [F.linear(x, w) for w in ws]) / LAYERS
            us, cfg, err = best_config(x, ws)
            best[(name, m)] = cfg
            floor = floor_us(n * k * 2, bw)
            table[f"{name}/{m}"] = {"floor_us": floor, "cublas_us": cub,
                                    "triton_us": us, "config": cfg, "rel_err": err}
            print(f"{name:8} {m:>4} {floor:7.1f} {cub:7.1f} {us:7.1f}  {cfg}")
    return table, best


def time_stack(weights: dict, m: int, best: dict, bw: float) -> dict:
    """A 16-layer stack of the four products, cuBLAS against Triton."""
    x = torch.randn(m, 2048, dtype=torch.bfloat16, device="cuda")
    h = torch.randn(m, 8192, dtype=torch.bfloat16, device="cuda")

    def stack(gemm):
        def run():
            for i in range(LAYERS):
                for name in SHAPES:
                    gemm(name, h if name == "down" else x, weights[name][i])
        return run

    cub = graph_time_us(stack(lambda name, a, w: F.linear(a, w)))
    tri = graph_time_us(stack(lambda name, a, w: skinny_gemm(a, w, **best[(name, m)])))
    floor = floor_us(sum(n * k for n, k in SHAPES.values()) * 2 * LAYERS, bw)
    print(f"stack of {LAYERS} layers, {m} rows: floor {floor:.0f} us, "
          f"cublas {cub:.0f} us, triton {tri:.0f} us")
    return {"floor_us": floor, "cublas_us": cub, "triton_us": tri}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 5])
    args = ap.parse_args()
    torch.manual_seed(0)
    bws = bandwidths()
    # The floor: weight bytes at the read rate (a GEMM reads its weight once).
    bw = bws["read"]
    print(f"bandwidth: copy {bws['copy'] / 1e9:.0f} GB/s, read {bw / 1e9:.0f} GB/s")
    weights = {name: [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
                      for _ in range(LAYERS)] for name, (n, k) in SHAPES.items()}
    shapes, best = time_shapes(weights, args.rows, bw)
    stack = {str(m): time_stack(weights, m, best, bw) for m in args.rows}
    result = {"meta": run_metadata(args), "copy_bw_GBps": bws["copy"] / 1e9,
              "read_bw_GBps": bw / 1e9, "shapes": shapes, "stack": stack}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
