"""A prototype for issue #26: the draft's attention over its short view in one
kernel launch (split over the KV, the splits combined by the last program of
each KV head), against FA3's main kernel plus its split combine, which a
profile of one 64K step put at 8.8 + 3 µs a layer pass, 0.75 ms a step
(`docs/design.md`). Not wired into the plugin: `view_attention_bench.py`
times both as CUDA-graph replays, and the answer on an H100
(``benchmarks/results/decode/20261127T0027Z_h100_view-attention-microbench.json``)
is that it does not pay: over a 1,408-token view at batch 1 FA3 takes 9.2 µs a
layer pass (main kernel and combine; 11.4 µs for 3 new tokens) and this
kernel 9.0 (8.9), about 50 µs of a 15.7 ms step.

Layout as vLLM's FlashAttention backend reads it: queries [num_tokens,
num_heads, head_dim] packed by request (``query_start_loc``), a paged cache
[num_blocks, block_size, num_kv_heads, head_dim] for keys and one for values,
a block table [num_reqs, max_blocks] and ``seq_lens`` (the keys each request
reads, its new tokens last: bottom-right causal masking, as FA's). Heads
share KV heads in groups (GQA); a program takes one KV head's group for all
of a request's new tokens (at most ``max_query_len``), one split of its keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _view_attention(
    q_ptr, k_ptr, v_ptr, block_table_ptr, seq_lens_ptr, query_start_ptr, out_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr, counter_ptr,
    scale,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, MAX_Q: tl.constexpr, ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    req = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)

    seq_len = tl.load(seq_lens_ptr + req)
    q_start = tl.load(query_start_ptr + req)
    q_len = tl.load(query_start_ptr + req + 1) - q_start
    # Whole tiles per split, so every split but the last starts on a tile.
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seq_len)

    # Row r is query token r // GROUP of the request and head r % GROUP of
    # this KV head's group; rows past q_len * GROUP are padding (tl.dot
    # wants at least 16).
    r = tl.arange(0, ROWS)
    qi = r // GROUP
    head = kv_head * GROUP + r % GROUP
    row_ok = (qi < q_len) & (qi < MAX_Q)
    # A query token sees the keys up to its own position (bottom-right).
    last_key = seq_len - q_len + qi
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + (q_start + qi)[:, None] * stride_qt + head[:, None] * stride_qh
                + d[None, :], mask=row_ok[:, None], other=0.0)

    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    for t0 in range(start, end, BLOCK_N):
        n = t0 + tl.arange(0, BLOCK_N)
        n_ok = n < end
        block = tl.load(block_table_ptr + req * stride_bt + n // BLOCK_SIZE, mask=n_ok,
                        other=0)
        slot = n % BLOCK_SIZE
        k = tl.load(k_ptr + block[:, None] * stride_kb + slot[:, None] * stride_ks
                    + kv_head * stride_kh + d[None, :], mask=n_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale  # [ROWS, BLOCK_N]
        seen = n_ok[None, :] & (n[None, :] <= last_key[:, None])
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf: no nan from -inf - -inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + block[:, None] * stride_vb + slot[:, None] * stride_vs
                    + kv_head * stride_vh + d[None, :], mask=n_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new

    group_id = req * num_kv_heads + kv_head
    part = group_id * NUM_SPLITS + split
    tl.store(part_acc_ptr + (part * ROWS + r)[:, None] * HEAD_DIM + d[None, :], acc)
    tl.store(part_m_ptr + part * ROWS + r, m)
    tl.store(part_l_ptr + part * ROWS + r, l)
    # The last split of this group to finish combines them (acq_rel: the
    # others' partials are visible to it), then resets the counter for the
    # next call (or graph replay).
    done = tl.atomic_add(counter_ptr + group_id, 1)
    if done == NUM_SPLITS - 1:
        m_all = tl.full([ROWS], float("-inf"), tl.float32)
        for sp in tl.static_range(NUM_SPLITS):
            m_sp = tl.load(part_m_ptr + (group_id * NUM_SPLITS + sp) * ROWS + r,
                           cache_modifier=".cg")
            m_all = tl.maximum(m_all, m_sp)
        m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
        l_all = tl.zeros([ROWS], tl.float32)
        o = tl.zeros([ROWS, HEAD_DIM], tl.float32)
        for sp in tl.static_range(NUM_SPLITS):
            p_id = group_id * NUM_SPLITS + sp
            w = tl.exp(tl.load(part_m_ptr + p_id * ROWS + r, cache_modifier=".cg") - m_all)
            l_all += w * tl.load(part_l_ptr + p_id * ROWS + r, cache_modifier=".cg")
            o += w[:, None] * tl.load(part_acc_ptr + (p_id * ROWS + r)[:, None] * HEAD_DIM
                                      + d[None, :], cache_modifier=".cg")
        o = o / tl.where(l_all == 0.0, 1.0, l_all)[:, None]
        tl.store(out_ptr + (q_start + qi)[:, None] * stride_ot + head[:, None] * stride_oh
                 + d[None, :], o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        tl.atomic_xchg(counter_ptr + group_id, 0)


class ViewAttention:
    """Persistent buffers for one shape (a captured graph replays over them):
    partial sums per (request, KV head, split) and a counter per (request, KV
    head) that the combining program leaves at zero."""

    def __init__(self, max_reqs: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 max_query_len: int = 1, num_splits: int = 8, block_n: int = 64,
                 device: str | torch.device = "cuda"):
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} heads do not group over {num_kv_heads} KV heads")
        self.group = num_heads // num_kv_heads
        self.max_q = max_query_len
        self.rows = max(16, triton.next_power_of_2(self.group * max_query_len))
        self.num_splits, self.block_n, self.head_dim = num_splits, block_n, head_dim
        parts = max_reqs * num_kv_heads * num_splits * self.rows
        self.part_acc = torch.empty(parts * head_dim, dtype=torch.float32, device=device)
        self.part_m = torch.empty(parts, dtype=torch.float32, device=device)
        self.part_l = torch.empty(parts, dtype=torch.float32, device=device)
        self.counter = torch.zeros(max_reqs * num_kv_heads, dtype=torch.int32, device=device)

    def __call__(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc,
                 scale: float, out=None, num_reqs: int | None = None):
        """q [num_tokens, num_heads, head_dim]; caches [num_blocks, block_size,
        num_kv_heads, head_dim]; block_table [>= num_reqs, max_blocks] int32;
        seq_lens [>= num_reqs]; query_start_loc [num_reqs + 1]."""
        num_reqs = num_reqs if num_reqs is not None else query_start_loc.numel() - 1
        out = torch.empty_like(q) if out is None else out
        num_kv_heads = k_cache.shape[2]
        grid = (self.num_splits, num_kv_heads, num_reqs)
        _view_attention[grid](
            q, k_cache, v_cache, block_table, seq_lens, query_start_loc, out,
            self.part_acc, self.part_m, self.part_l, self.counter, scale,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_table.stride(0), out.stride(0), out.stride(1),
            GROUP=self.group, MAX_Q=self.max_q, ROWS=self.rows, HEAD_DIM=self.head_dim,
            BLOCK_SIZE=k_cache.shape[1], BLOCK_N=self.block_n, NUM_SPLITS=self.num_splits,
        )
        return out


def reference(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale):
    """The same attention in plain torch (float32), request by request."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    block_size, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    for req in range(query_start_loc.numel() - 1):
        a, b = int(query_start_loc[req]), int(query_start_loc[req + 1])
        n = int(seq_lens[req])
        slots = torch.arange(n, device=q.device)
        blocks = block_table[req, slots // block_size].long()
        k = k_cache[blocks, slots % block_size].float()  # [n, kv_heads, d]
        v = v_cache[blocks, slots % block_size].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,nhd->hqn", q[a:b].float(), k) * scale
        pos = n - (b - a) + torch.arange(b - a, device=q.device)
        s = s.masked_fill(slots[None, None, :] > pos[None, :, None], float("-inf"))
        out[a:b] = torch.einsum("hqn,nhd->qhd", s.softmax(-1), v)
    return out
