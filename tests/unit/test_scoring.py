"""Per-block log-sum-exp over paged KV against a dense reference (torch, CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_specextend.retrieval.scoring import block_lse, block_lse_torch, gather_keys
from vllm_specextend.retrieval.selection import chunk_mass


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _paged_case(
    seed: int,
    num_kv_heads: int,
    group: int,
    bs: int,
    head_size: int,
    ctx_lens: list[int],
    extra_cols: int = 2,
):
    gen = torch.Generator().manual_seed(seed)
    rows = len(ctx_lens)
    num_blocks = _cdiv(max(ctx_lens), bs)
    width = num_blocks + extra_cols
    num_cache_blocks = rows * width + 3
    cache = torch.randn(
        num_cache_blocks, num_kv_heads, bs, 2 * head_size, generator=gen
    )
    perm = torch.randperm(num_cache_blocks, generator=gen)[: rows * width]
    block_table = perm.view(rows, width).to(torch.int32)
    query = torch.randn(rows, num_kv_heads * group, head_size, generator=gen)
    ctx = torch.tensor(ctx_lens, dtype=torch.int32)
    return query, cache, block_table, ctx, num_blocks


def _dense_reference(query, keys_of_row, ctx_lens, num_blocks, bs, scale):
    """keys_of_row(r) -> [ctx, Hkv, D] keys in logical order (float64)."""
    rows, heads, _ = query.shape
    out = torch.full((rows, heads, num_blocks), float("-inf"), dtype=torch.float64)
    for r in range(rows):
        n = int(ctx_lens[r])
        keys = keys_of_row(r)[:n]
        num_kv_heads = keys.shape[1]
        group = heads // num_kv_heads
        for h in range(heads):
            k = keys[:, h // group, :]
            logits = scale * (k @ query[r, h].double())  # [n]
            for j in range(_cdiv(n, bs)):
                out[r, h, j] = torch.logsumexp(logits[j * bs : (j + 1) * bs], dim=0)
    return out


def _keys_from_cache(cache, block_table, head_size, bs):
    def keys_of_row(r):
        blocks = block_table[r].long()
        k = cache[blocks][..., :head_size]  # [W, Hkv, bs, D]
        k = k.permute(0, 2, 1, 3).reshape(-1, cache.shape[1], head_size)
        return k.double()

    return keys_of_row


CASES = [
    # seed, Hkv, group, bs, D, ctx_lens
    (0, 2, 1, 4, 8, [1, 4, 5, 13, 16]),
    (1, 2, 2, 16, 16, [1, 17, 31, 48, 100, 3]),
    (2, 1, 4, 8, 32, [64, 63, 9, 1]),
    (3, 4, 2, 1, 8, [1, 2, 7]),
    # More rows than the implementation processes per pass.
    (4, 2, 4, 4, 8, [1, 3, 8, 9, 12, 15, 16, 2, 21, 40, 39, 5, 6, 7, 33, 1, 24, 17]),
]


@pytest.mark.parametrize("seed,hkv,group,bs,d,ctx_lens", CASES)
def test_block_lse_matches_dense(seed, hkv, group, bs, d, ctx_lens):
    query, cache, bt, ctx, num_blocks = _paged_case(seed, hkv, group, bs, d, ctx_lens)
    scale = 1.0 / math.sqrt(d)
    got = block_lse_torch(query, cache, bt, ctx, num_blocks, scale)
    want = _dense_reference(
        query, _keys_from_cache(cache, bt, d, bs), ctx, num_blocks, bs, scale
    )
    assert got.shape == (len(ctx_lens), hkv * group, num_blocks)
    assert got.dtype == torch.float32
    for r, n in enumerate(ctx_lens):
        filled = _cdiv(n, bs)
        assert torch.all(torch.isfinite(got[r, :, :filled])), r
        assert torch.all(got[r, :, filled:] == float("-inf")), r
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    # block_lse dispatches to the torch path on CPU.
    torch.testing.assert_close(block_lse(query, cache, bt, ctx, num_blocks, scale), got)


def test_block_lse_uses_kv_head_of_group():
    # Query head h must read kv head h // G: make kv heads very different.
    bs, d = 4, 8
    query = torch.zeros(1, 4, d)
    query[0, :, 0] = 1.0
    cache = torch.zeros(1, 2, bs, 2 * d)
    cache[0, 0, :, 0] = 1.0  # kv head 0: logit 1 per token
    cache[0, 1, :, 0] = 3.0  # kv head 1: logit 3 per token
    bt = torch.zeros(1, 1, dtype=torch.int32)
    got = block_lse_torch(query, cache, bt, torch.tensor([bs]), 1, 1.0)
    base = math.log(bs)
    torch.testing.assert_close(
        got[0, :, 0], torch.tensor([1 + base, 1 + base, 3 + base, 3 + base])
    )


def test_block_lse_ignores_keys_past_context_and_values():
    query, cache, bt, ctx, num_blocks = _paged_case(5, 2, 2, 4, 8, [6, 3])
    base = block_lse_torch(query, cache, bt, ctx, num_blocks, 0.5)
    poisoned = cache.clone()
    poisoned[..., 8:] = 1e6  # value half
    for r, n in enumerate(ctx.tolist()):
        for t in range(n, num_blocks * 4):
            poisoned[bt[r, t // 4], :, t % 4, :8] = 1e6  # keys past ctx
    again = block_lse_torch(query, poisoned, bt, ctx, num_blocks, 0.5)
    torch.testing.assert_close(again, base)


def test_nhd_strided_cache_matches_contiguous():
    seed, hkv, group, bs, d = 7, 2, 2, 8, 16
    ctx_lens = [1, 8, 9, 30, 17]
    query, cache, bt, ctx, num_blocks = _paged_case(seed, hkv, group, bs, d, ctx_lens)
    # Same logical [B, Hkv, bs, 2D] cache, physically (B, bs, Hkv, 2D).
    nhd = cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    assert not nhd.is_contiguous()
    assert torch.equal(nhd, cache)
    scale = 0.3
    a = block_lse_torch(query, cache, bt, ctx, num_blocks, scale)
    b = block_lse_torch(query, nhd, bt, ctx, num_blocks, scale)
    torch.testing.assert_close(a, b)
    want = _dense_reference(
        query, _keys_from_cache(cache, bt, d, bs), ctx, num_blocks, bs, scale
    )
    torch.testing.assert_close(b.double(), want, rtol=1e-4, atol=1e-4)


# --- CPU-style pages with a key order ---------------------------------------------


def _cpu_pages(cache: torch.Tensor, head_size: int):
    """Store each (block, head) page's keys transposed [D, bs] in its first
    bs*D elements, values after; return the page tensor and key_order."""
    num_cache_blocks, hkv, bs, _ = cache.shape
    keys = cache[..., :head_size]  # [B, H, bs, D]
    values = cache[..., head_size:]
    pages = torch.empty(num_cache_blocks, hkv, bs * 2 * head_size)
    pages[..., : bs * head_size] = keys.transpose(-1, -2).reshape(
        num_cache_blocks, hkv, -1
    )
    pages[..., bs * head_size :] = values.reshape(num_cache_blocks, hkv, -1)
    pages = pages.view(num_cache_blocks, hkv, bs, 2 * head_size)
    # key element (t, d) lives at page offset d * bs + t
    t = torch.arange(bs)[:, None]
    dd = torch.arange(head_size)[None, :]
    key_order = (dd * bs + t).reshape(-1)
    return pages, key_order


def test_gather_keys_with_key_order():
    gen = torch.Generator().manual_seed(11)
    bs, d, hkv = 4, 8, 3
    cache = torch.randn(6, hkv, bs, 2 * d, generator=gen)
    pages, key_order = _cpu_pages(cache, d)
    # The page layout really differs from the logical one.
    assert not torch.equal(pages[..., :d], cache[..., :d])
    blocks = torch.tensor([4, 0, 5, 4], dtype=torch.int64)
    got = gather_keys(pages, blocks, d, key_order)
    assert got.shape == (4, hkv, bs, d)
    assert torch.equal(got, cache[blocks][..., :d])
    assert torch.equal(gather_keys(cache, blocks, d, None), cache[blocks][..., :d])


@pytest.mark.parametrize("seed,hkv,group,bs,d,ctx_lens", CASES[:3])
def test_block_lse_with_key_order_matches_dense(seed, hkv, group, bs, d, ctx_lens):
    query, cache, bt, ctx, num_blocks = _paged_case(seed, hkv, group, bs, d, ctx_lens)
    pages, key_order = _cpu_pages(cache, d)
    scale = 1.0 / math.sqrt(d)
    got = block_lse_torch(query, pages, bt, ctx, num_blocks, scale, key_order)
    want = _dense_reference(
        query, _keys_from_cache(cache, bt, d, bs), ctx, num_blocks, bs, scale
    )
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(
        block_lse(query, pages, bt, ctx, num_blocks, scale, key_order), got
    )


def test_chunk_mass_of_block_lse_sums_to_one():
    bs, per_chunk = 4, 2
    chunk = bs * per_chunk
    ctx_lens = [chunk, 3 * chunk, 5 * chunk, 5 * chunk]
    query, cache, bt, ctx, num_blocks = _paged_case(12, 2, 2, bs, 8, ctx_lens)
    lse = block_lse_torch(query, cache, bt, ctx, num_blocks, 0.35)
    mass = chunk_mass(lse, per_chunk)
    assert mass.shape == (len(ctx_lens), num_blocks // per_chunk)
    torch.testing.assert_close(mass.sum(-1), torch.ones(len(ctx_lens)))
    for r, n in enumerate(ctx_lens):
        assert torch.all(mass[r, n // chunk :] == 0)
        assert torch.all(mass[r, : n // chunk] > 0)
