"""How fast the target's prefill of one long prompt could run on this GPU: its
GEMMs (cuBLAS, ``F.linear``) and its causal attention (vLLM's FA3, else
torch's SDPA), back to back at the shapes ``vllm serve`` runs them in
(8,192-token chunks, its default ``max_num_batched_tokens`` on an 80 GB+
GPU), without the elementwise kernels (norms, RoPE, SiLU, residual adds, the
KV write). So the prompt's time here is a floor under vLLM's own prefill on
the same GPU, with the kernels vLLM itself calls.

Why it exists: issue #22's H200 cell (32K prompts, concurrency 16) measures
decode-phase tok/s over a window that the 16 prompts' prefill fills about
half of, in every mode. How far that prefill sits above this floor says how
much of the window any work on the target's kernels could take back
(``docs/results.md``, "the target's prefill against this GPU's kernels").

Model shape from a ``config.json`` (Llama: hidden, heads, KV heads, head dim,
intermediate, layers). Each layer runs qkv, attention over the chunk and all
earlier tokens, o, gate_up, down; the prompt runs its chunks one after
another. Attention is timed contiguous (``cu_seqlens_k``) and paged
(``block_table``, 16-token blocks, as vLLM's cache holds it). Timings are
CUDA events around whole prompts, repeated (median, min, max), after a
warm-up prompt, so the clocks are those of a sustained prefill; every index
tensor is built before, so no timed call waits on a copy from the host.
``--window N`` reads each chunk through the plugin's ``draft_prefill_window``
view (the sinks and the N tokens before the chunk, paged), ``--fp8`` runs
the GEMMs in fp8 as an fp8 checkpoint's (the draft's passes, issue #22).

    python3 -m benchmarks.gpu.prefill_floor_bench --model .gpu/models/llama31_8b --out out.json
"""

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.gpu.skinny_gemm_bench import bandwidths
from benchmarks.harness.measure import spread
from benchmarks.harness.meta import run_metadata

BLOCK_SIZE = 16
"""vLLM's KV block size for FlashAttention on Hopper (its default)."""


def shape(model: Path) -> dict:
    cfg = json.loads((model / "config.json").read_text())
    heads = cfg["num_attention_heads"]
    return {
        "hidden": cfg["hidden_size"],
        "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads", heads),
        "head_dim": cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "intermediate": cfg["intermediate_size"],
        "layers": cfg["num_hidden_layers"],
    }


def gemm_shapes(s: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each projection of a layer."""
    q = s["heads"] * s["head_dim"]
    kv = s["kv_heads"] * s["head_dim"]
    return {"qkv": (s["hidden"], q + 2 * kv), "o": (q, s["hidden"]),
            "gate_up": (s["hidden"], 2 * s["intermediate"]),
            "down": (s["intermediate"], s["hidden"])}


def chunk_bounds(context: int, chunk: int) -> list[tuple[int, int]]:
    """(first token, tokens) of each chunk of a ``context``-token prompt."""
    return [(start, min(chunk, context - start)) for start in range(0, context, chunk)]


def attention_flops(s: dict, start: int, n: int) -> float:
    """QK^T and PV of ``n`` queries after ``start`` earlier tokens, causal:
    query i reads start + i + 1 keys."""
    pairs = n * start + n * (n + 1) / 2
    return 2 * 2 * pairs * s["heads"] * s["head_dim"]


def fa3():
    """vLLM's FA3 entry, or None where vLLM (or FA3) is not here."""
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func
        from vllm.vllm_flash_attn.flash_attn_interface import is_fa_version_supported
    except ImportError:
        return None
    return flash_attn_varlen_func if is_fa_version_supported(3) else None


def window_view(start: int, n: int, window: int | None, sinks: int) -> tuple[int, int]:
    """(first block past the sinks, tokens the chunk's row reads) of a chunk
    at ``start``: the plugin's ``draft_prefill_window`` view reads the sink
    blocks and whole blocks from ``start - window`` to the chunk's end
    (``ViewBuilder.params``); without a window, or where it drops nothing,
    the whole prompt so far."""
    end = start + n
    sink_blocks = -(-sinks // BLOCK_SIZE)
    if window is None or (start - window) // BLOCK_SIZE <= sink_blocks:
        return 0, end
    first = (start - window) // BLOCK_SIZE
    return first, sink_blocks * BLOCK_SIZE + end - first * BLOCK_SIZE


class Attention:
    """Each chunk's causal attention over the prompt so far (or its window),
    by one of the ways below; ``__call__(layer, chunk index)``. Every index
    tensor is built here, so the timed calls copy nothing from the host."""

    def __init__(self, s: dict, context: int, chunks: list[tuple[int, int]], how: str,
                 layers: int, window: int | None = None, sinks: int = 0):
        dev, dt = "cuda", torch.bfloat16
        self.how, self.chunks = how, chunks
        self.q = torch.randn(context, s["heads"], s["head_dim"], device=dev, dtype=dt)
        self.out = torch.empty_like(self.q)
        if window is not None and how != "fa3_paged":
            raise ValueError("a window reads through a block table: --attention fa3_paged")

        def i32(values):
            return torch.tensor(values, device=dev, dtype=torch.int32)

        # Per layer a KV of its own, so no layer finds the last one's in L2.
        kv_shape = (context, s["kv_heads"], s["head_dim"])
        self.kw = [dict(max_seqlen_q=n, cu_seqlens_q=i32([0, n]), causal=True,
                        out=self.out[a:a + n], fa_version=3) for a, n in chunks]
        if how == "fa3_paged":
            blocks = -(-context // BLOCK_SIZE)
            kv_shape = (blocks, BLOCK_SIZE, s["kv_heads"], s["head_dim"])
            # Blocks in a shuffled order, as a cache that has served other
            # requests holds them.
            table = torch.randperm(blocks, device=dev, dtype=torch.int32)
            sink_blocks = -(-sinks // BLOCK_SIZE)
            for kw, (a, n) in zip(self.kw, chunks):
                first, used = window_view(a, n, window, sinks)
                row = table if first == 0 else torch.cat([table[:sink_blocks], table[first:]])
                kw.update(block_table=row[None].contiguous(), seqused_k=i32([used]),
                          max_seqlen_k=used)
        elif how == "fa3":
            for kw, (a, n) in zip(self.kw, chunks):
                kw.update(cu_seqlens_k=i32([0, a + n]), max_seqlen_k=a + n)
        self.k = [torch.randn(kv_shape, device=dev, dtype=dt) for _ in range(layers)]
        self.v = [torch.randn(kv_shape, device=dev, dtype=dt) for _ in range(layers)]
        self.fn = fa3()

    def __call__(self, layer: int, i: int) -> None:
        start, n = self.chunks[i]
        end = start + n
        q = self.q[start:end]
        if self.how == "fa3":
            self.fn(q, self.k[layer][:end], self.v[layer][:end], **self.kw[i])
            return
        if self.how == "fa3_paged":
            self.fn(q, self.k[layer], self.v[layer], **self.kw[i])
            return
        # SDPA: the chunk's queries read all earlier keys, then the chunk
        # causally (bottom-right), as one call with an explicit causal bias;
        # never the math backend (it would build the [heads, n, end] scores).
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.attention.bias import causal_lower_right
        qh = q.transpose(0, 1)[None]  # [1, heads, n, d]
        kh = self.k[layer][:end].transpose(0, 1)[None]  # [1, kv_heads, end, d]
        vh = self.v[layer][:end].transpose(0, 1)[None]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION,
                          SDPBackend.EFFICIENT_ATTENTION]):
            F.scaled_dot_product_attention(qh, kh, vh, attn_mask=causal_lower_right(n, end),
                                           enable_gqa=True)


def timed(fn, repeats: int) -> list[float]:
    """Milliseconds of ``fn()`` per repeat, after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def gemm_fn(fp8: bool):
    """(weight from a bf16 one, input from a bf16 one, product): cuBLAS bf16,
    or fp8 (e4m3, per-tensor scales, ``torch._scaled_mm``) with the input
    quantized beforehand (its quantization is an elementwise kernel, left out
    as the others are)."""
    if not fp8:
        return (lambda w: w), (lambda x: x), F.linear
    one = torch.ones((), device="cuda", dtype=torch.float32)

    def to_fp8(t):
        return t.to(torch.float8_e4m3fn)

    def product(x, w):  # w: [out, in] row-major, so w.t() is column-major
        return torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return to_fp8, to_fp8, product


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="a directory with config.json")
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=8192,
                   help="tokens a step (vllm serve's default max_num_batched_tokens)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--attention", nargs="+", default=["fa3", "fa3_paged", "sdpa"],
                   choices=["fa3", "fa3_paged", "sdpa"])
    p.add_argument("--window", type=int, default=None,
                   help="the plugin's draft_prefill_window: each chunk reads the sinks "
                        "and this many tokens before it (fa3_paged only)")
    p.add_argument("--sinks", type=int, default=32, help="sink tokens (the plugin's default)")
    p.add_argument("--fp8", action="store_true", help="fp8 GEMMs (an fp8 checkpoint's)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.window is not None:
        args.attention = ["fa3_paged"]

    s = shape(args.model)
    L = s["layers"]
    chunks = chunk_bounds(args.context, args.chunk)
    dev, dt = "cuda", torch.bfloat16
    shapes = gemm_shapes(s)
    weight, act, product = gemm_fn(args.fp8)
    weights = {name: [weight(torch.randn(o, i, device=dev, dtype=dt) * 0.02) for _ in range(L)]
               for name, (i, o) in shapes.items()}
    x = {name: act(torch.randn(args.chunk, i, device=dev, dtype=dt))
         for name, (i, o) in shapes.items()}
    gemm_flops = sum(2 * n * i * o for _, n in chunks for i, o in shapes.values()) * L
    # Keys each chunk reads before its own: all earlier ones, or its window's.
    before = [window_view(a, n, args.window, args.sinks)[1] - n for a, n in chunks]
    attn_flops = sum(attention_flops(s, k, n) for k, (_, n) in zip(before, chunks)) * L

    def gemms(layer: int, n: int) -> None:
        for name in shapes:
            product(x[name][:n], weights[name][layer])

    def gemm_prompt() -> None:
        for _, n in chunks:
            for layer in range(L):
                gemms(layer, n)

    result = {"shape": s, "context": args.context, "chunk": args.chunk,
              "window": args.window, "sinks": args.sinks if args.window else None,
              "gemm_dtype": "fp8_e4m3" if args.fp8 else "bf16",
              "gemm_tflop": gemm_flops / 1e12, "attention_tflop": attn_flops / 1e12}
    t = timed(gemm_prompt, args.repeats)
    result["gemm_ms"] = spread(t)
    result["gemm_tflop_s"] = gemm_flops / 1e9 / statistics.median(t)
    print(f"GEMMs ({result['gemm_dtype']}) of a {args.context}-token prompt: "
          f"{statistics.median(t):.1f} ms, {result['gemm_tflop_s']:.0f} TFLOP/s", flush=True)

    result["attention"] = {}
    for how in args.attention:
        if how.startswith("fa3") and fa3() is None:
            result["attention"][how] = {"error": "vLLM's FA3 is not importable here"}
            continue
        try:
            attn = Attention(s, args.context, chunks, how, L, args.window, args.sinks)

            def attn_prompt() -> None:
                for i in range(len(chunks)):
                    for layer in range(L):
                        attn(layer, i)

            def whole_prompt() -> None:
                for i, (_, n) in enumerate(chunks):
                    for layer in range(L):
                        gemms(layer, n)
                        attn(layer, i)

            ta = timed(attn_prompt, args.repeats)
            tw = timed(whole_prompt, args.repeats)
        except Exception as e:  # a backend this GPU or build lacks: say which, go on
            result["attention"][how] = {"error": f"{type(e).__name__}: {e}"[:500]}
            print(f"{how}: {result['attention'][how]['error']}", flush=True)
            continue
        finally:
            attn = None
            torch.cuda.empty_cache()
        result["attention"][how] = {
            "attention_ms": spread(ta),
            "attention_tflop_s": attn_flops / 1e9 / statistics.median(ta),
            "prompt_ms": spread(tw),
            "prompt_tflop_s": (gemm_flops + attn_flops) / 1e9 / statistics.median(tw),
        }
        print(f"{how}: attention {statistics.median(ta):.1f} ms "
              f"({result['attention'][how]['attention_tflop_s']:.0f} TFLOP/s); GEMMs and "
              f"attention back to back {statistics.median(tw):.1f} ms "
              f"({result['attention'][how]['prompt_tflop_s']:.0f} TFLOP/s)", flush=True)

    result["read_bandwidth_gb_s"] = bandwidths()["read"] / 1e9
    result["meta"] = run_metadata(args)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "meta"}, indent=1))


if __name__ == "__main__":
    main()
