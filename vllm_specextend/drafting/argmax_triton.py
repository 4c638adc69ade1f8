"""Triton kernel: the greedy draft token, argmax over a row of logits.

Why: on an H100 one ``torch.argmax`` over a draft's 128K-entry logits row took
34 us (``benchmarks/results/decode/20261124T1959Z_h100_profile_spec-extend_64k_b1.txt``),
K of them per step: a reduction run by too few blocks for a 256 KB row. Here
``_PARTS`` programs per row each scan a slice and keep its largest value and
first index, and one program per row picks among them, so the row is read
once by the whole GPU.

Contract as ``torch.argmax(logits, dim=-1)`` on finite values: the first index
of the largest value (ties go to the lower index, as in torch), int64.
"""

import torch
import triton
import triton.language as tl

_BLOCK = 1024
_PARTS = 64  # programs per row in the first pass; slices of V / _PARTS entries


@triton.jit(do_not_specialize=["vocab", "part_len", "stride_r"])
def _argmax_parts_kernel(x_ptr, vals_ptr, idx_ptr, vocab, part_len, stride_r,
                         PARTS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    p = tl.program_id(1)
    start = p * part_len
    end = tl.minimum(start + part_len, vocab)
    best = -float("inf")
    best_idx = start
    for off in range(start, end, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + r * stride_r + cols, mask=cols < end,
                    other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        i = tl.argmax(x, axis=0, tie_break_left=True) + off
        # Strictly greater: an earlier block keeps a tie (first index wins).
        take = m > best
        best_idx = tl.where(take, i, best_idx)
        best = tl.where(take, m, best)
    tl.store(vals_ptr + r * PARTS + p, best)
    tl.store(idx_ptr + r * PARTS + p, best_idx)


@triton.jit
def _argmax_pick_kernel(vals_ptr, idx_ptr, out_ptr, PARTS: tl.constexpr):
    r = tl.program_id(0)
    parts = tl.arange(0, PARTS)
    vals = tl.load(vals_ptr + r * PARTS + parts)
    idx = tl.load(idx_ptr + r * PARTS + parts)
    # Parts cover increasing slices, so the first part holding the largest
    # value holds its first index.
    p = tl.argmax(vals, axis=0, tie_break_left=True)
    tl.store(out_ptr + r, tl.sum(tl.where(parts == p, idx, 0), axis=0))


def argmax_triton(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` [R, V] (last dim contiguous) -> [R] int64."""
    rows, vocab = logits.shape
    vals = torch.empty(rows, _PARTS, dtype=torch.float32, device=logits.device)
    idx = torch.empty(rows, _PARTS, dtype=torch.int64, device=logits.device)
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    part_len = -(-vocab // _PARTS)
    _argmax_parts_kernel[(rows, _PARTS)](logits, vals, idx, vocab, part_len,
                                         logits.stride(0), PARTS=_PARTS, BLOCK=_BLOCK)
    _argmax_pick_kernel[(rows,)](vals, idx, out, PARTS=_PARTS)
    return out
