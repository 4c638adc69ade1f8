"""Triton kernel: per-KV-block log-sum-exp of one query token over a paged K cache.

For each request row r, query head h and logical KV block j it computes

    lse[r, h, j] = logsumexp_t( scale * <query[r, h, :], K[block_table[r, j], h // G, t, :]> )

over the tokens t of block j with j * bs + t < ctx_lens[r] (-inf when the block holds no
such token), in fp32, G = Hq // Hkv. Contract as ``scoring.block_lse_torch``:
query [R, Hq, D] fp16/bf16/fp32, kv_cache [num_cache_blocks, Hkv, bs, 2*D] with arbitrary
strides (key = [..., :D], value never read), block_table [R, >= num_blocks] int32,
ctx_lens [R] int32; returns [R, Hq, num_blocks] float32.

Why a kernel: scoring runs once per retrieval and reads only the scoring layer's K, once.
It is a GEMV per KV head, i.e. memory bound, so each K tile is loaded once and scored
against all G query heads sharing its KV head, and only valid tokens are read (masked
loads): bytes moved ~= sum_r ctx_lens[r] * Hkv * D * elem_size.
"""

import torch
import triton
import triton.language as tl

# K rows per tile: wide enough for good memory-level parallelism, small enough to keep the
# [rows, D] tile in registers. A tile spans several KV blocks when bs < _TILE_ROWS.
_TILE_ROWS = 64
# Enough resident programs per SM to keep HBM busy (each program prefetches one tile
# ahead only), but few enough that each still amortises its q load.
_PROGRAMS_PER_SM = 8
_MAX_GRID_Y = 65535
_NUM_STAGES = 2  # K tile of the next iteration is prefetched (cp.async) during this one
_NUM_SMS: dict = {}


# Per-call sizes: specialising them (==1, %16) would recompile as contexts grow.
@triton.jit(do_not_specialize=["num_blocks", "tiles_per_row", "tiles_per_prog",
                               "stride_btr", "stride_or", "stride_oh"])
def _block_lse_kernel(
    q_ptr, kv_ptr, bt_ptr, ctx_ptr, out_ptr,
    num_kv_heads, num_blocks, tiles_per_row, tiles_per_prog, qk_scale_log2,
    stride_qr, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kt, stride_kd,
    stride_btr, stride_btj,
    stride_or, stride_oh, stride_oj,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    BS: tl.constexpr, NB_TILE: tl.constexpr, K_HALF: tl.constexpr, SPLIT_Q: tl.constexpr,
):
    """Program (r * Hkv + kv_head, c) handles tiles [c * tiles_per_prog, +tiles_per_prog)
    of NB_TILE logical blocks each, for the G query heads of that kv head."""
    TILE_N: tl.constexpr = NB_TILE * BS
    LN2: tl.constexpr = 0.6931471805599453
    pid_rh = tl.program_id(0)
    r = pid_rh // num_kv_heads
    h = pid_rh % num_kv_heads

    ctx_len = tl.load(ctx_ptr + r)
    # Tiles in [tile_lo, tile_mid) hold valid tokens; [tile_mid, tile_hi) only get -inf,
    # so programs entirely past ctx_len read no K (early exit without a return).
    n_valid_tiles = tl.cdiv(tl.minimum(tl.cdiv(ctx_len, BS), num_blocks), NB_TILE)
    tile_lo = tl.program_id(1) * tiles_per_prog
    tile_hi = tl.minimum(tile_lo + tiles_per_prog, tiles_per_row)
    tile_mid = tl.maximum(tl.minimum(tile_hi, n_valid_tiles), tile_lo)

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    offs_n = tl.arange(0, TILE_N)
    offs_jb = tl.arange(0, NB_TILE)
    g_mask = offs_g < G
    d_mask = offs_d < D
    heads = h * G + offs_g

    q = tl.load(q_ptr + r.to(tl.int64) * stride_qr + heads[:, None] * stride_qh
                + offs_d[None, :] * stride_qd,
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)
    if K_HALF:
        # Tensor-core path for a half cache: fp16/bf16 products are exact in fp32 and
        # accumulate in fp32, i.e. the same as upcasting. A q of another dtype is split into
        # hi + lo parts in the cache dtype (>= 16 mantissa bits) because upcasting the half
        # K tile to fp32 for an fp32 dot spills registers.
        q_hi = q.to(kv_ptr.dtype.element_ty)
        if SPLIT_Q:
            q_lo = (q.to(tl.float32) - q_hi.to(tl.float32)).to(kv_ptr.dtype.element_ty)
    else:
        q = q.to(tl.float32)

    # int64: block index * stride_kb overflows int32 on large caches.
    k_base = kv_ptr + h.to(tl.int64) * stride_kh + (offs_n % BS)[:, None] * stride_kt \
        + offs_d[None, :] * stride_kd
    bt_base = bt_ptr + r.to(tl.int64) * stride_btr
    out_base = out_ptr + r.to(tl.int64) * stride_or + heads[:, None] * stride_oh
    out_gmask = g_mask[:, None]

    for tile in range(tile_lo, tile_mid):
        j = tile * NB_TILE + offs_n // BS  # logical block of each K row
        # Masking rows also keeps garbage table entries past the valid blocks unread.
        row_ok = (j * BS + offs_n % BS < ctx_len) & (j < num_blocks)
        blk = tl.load(bt_base + j * stride_btj, mask=row_ok, other=0).to(tl.int64)
        k = tl.load(k_base + blk[:, None] * stride_kb,
                    mask=row_ok[:, None] & d_mask[None, :], other=0.0)
        if K_HALF:
            s = tl.dot(q_hi, tl.trans(k))
            if SPLIT_Q:
                s = tl.dot(q_lo, tl.trans(k), acc=s)
        else:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")  # no tf32 rounding
        s = tl.where(row_ok[None, :], s * qk_scale_log2, float("-inf"))
        s = tl.reshape(s, (G_PAD, NB_TILE, BS))
        m = tl.max(s, axis=2)
        m_safe = tl.where(m == float("-inf"), 0.0, m)  # all-masked block -> log2(0) = -inf
        lse = (m_safe + tl.log2(tl.sum(tl.exp2(s - m_safe[:, :, None]), axis=2))) * LN2
        jj = tile * NB_TILE + offs_jb
        tl.store(out_base + jj[None, :] * stride_oj, lse,
                 mask=out_gmask & (jj < num_blocks)[None, :])

    neg_inf = tl.full((G_PAD, NB_TILE), float("-inf"), tl.float32)
    for tile in range(tile_mid, tile_hi):
        jj = tile * NB_TILE + offs_jb
        tl.store(out_base + jj[None, :] * stride_oj, neg_inf,
                 mask=out_gmask & (jj < num_blocks)[None, :])


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":  # TRITON_INTERPRET=1 on CPU tensors
        return 1
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


def block_lse_triton(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                     ctx_lens: torch.Tensor, num_blocks: int, scale: float) -> torch.Tensor:
    """Per-block LSE [R, Hq, num_blocks] float32; same contract as ``block_lse_torch``."""
    R, Hq, D = query.shape
    _, Hkv, BS, D2 = kv_cache.shape
    assert D2 == 2 * D, f"kv_cache last dim {D2} != 2 * head_size {D}"
    assert Hq % Hkv == 0, f"Hq={Hq} not a multiple of Hkv={Hkv}"
    assert BS >= 1 and BS & (BS - 1) == 0, f"block size {BS} must be a power of two"
    assert block_table.dtype == torch.int32 and ctx_lens.dtype == torch.int32
    assert block_table.shape[0] == R and ctx_lens.shape[0] == R
    assert 0 <= num_blocks <= block_table.shape[1]
    fp = (torch.float16, torch.bfloat16, torch.float32)
    assert query.dtype in fp and kv_cache.dtype in fp, (query.dtype, kv_cache.dtype)

    out = torch.empty((R, Hq, num_blocks), dtype=torch.float32, device=query.device)
    if R == 0 or num_blocks == 0:
        return out
    G = Hq // Hkv
    nb_tile = max(1, _TILE_ROWS // BS)
    tiles_per_row = triton.cdiv(num_blocks, nb_tile)
    target = _num_sms(query.device) * _PROGRAMS_PER_SM
    tiles_per_prog = max(1, (R * Hkv * tiles_per_row) // target,
                         triton.cdiv(tiles_per_row, _MAX_GRID_Y))
    grid = (R * Hkv, triton.cdiv(tiles_per_row, tiles_per_prog))
    d_pad = max(16, triton.next_power_of_2(D))
    k_half = kv_cache.dtype != torch.float32
    tile_bytes = nb_tile * BS * d_pad * kv_cache.element_size()
    _block_lse_kernel[grid](
        query, kv_cache, block_table, ctx_lens, out,
        Hkv, num_blocks, tiles_per_row, tiles_per_prog, float(scale) * 1.4426950408889634,
        *query.stride(), *kv_cache.stride(), *block_table.stride(), *out.stride(),
        G=G, G_PAD=max(16, triton.next_power_of_2(G)), D=D, D_PAD=d_pad,
        BS=BS, NB_TILE=nb_tile, K_HALF=k_half, SPLIT_Q=k_half and query.dtype != kv_cache.dtype,
        num_warps=4 if tile_bytes <= 16384 else 8, num_stages=_NUM_STAGES,
    )
    return out
