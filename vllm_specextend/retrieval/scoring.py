"""Final-layer attention mass per KV block, read from the paged cache.

For each scored row: one query (the last accepted token, post-RoPE, every query
head) against the keys of the target's last attention layer, giving
``lse[r, h, j] = logsumexp_t(scale * q[r, h] . K[j, h // G, t])`` per logical
block j. ``selection.chunk_mass`` turns that into the softmax mass per chunk.
No attention matrix over the whole context is kept: one block row at a time
(torch) or one tile per program (Triton).

Key layouts (``kv_cache`` has the logical shape [blocks, Hkv, bs, 2*D]):

* GPU backends: the key of token t is ``kv_cache[b, h, t, :D]`` (any strides).
* CPU attention: each (block, head) page stores its ``bs*D`` key elements in
  an ISA-specific order; ``key_order`` maps (t, d) to the page offset (see
  ``compat.cpu_key_order``).
"""

from __future__ import annotations

import torch

_ROWS_PER_PASS = 8


def gather_keys(
    kv_cache: torch.Tensor,
    blocks: torch.Tensor,
    head_size: int,
    key_order: torch.Tensor | None,
) -> torch.Tensor:
    """Keys of physical ``blocks`` ([n] int64) as [n, Hkv, bs, D]."""
    # index_select, not advanced indexing: on CPU (torch 2.11) the latter costs
    # ~10 ms per call even for a few small pages, index_select microseconds.
    return page_keys(kv_cache.index_select(0, blocks), head_size, key_order)


def page_keys(
    pages: torch.Tensor, head_size: int, key_order: torch.Tensor | None
) -> torch.Tensor:
    """Keys of KV pages taken out of the cache ([n, Hkv, bs, 2*D], contiguous,
    as ``index_select`` returns them) as [n, Hkv, bs, D]."""
    if key_order is None:
        return pages[..., :head_size]
    n, num_kv_heads, block_size = pages.shape[:3]
    flat = pages.view(n, num_kv_heads, -1)[..., : block_size * head_size]
    return flat.index_select(-1, key_order).view(n, num_kv_heads, block_size, head_size)


def set_page_keys(
    pages: torch.Tensor, keys: torch.Tensor, key_order: torch.Tensor | None
) -> None:
    """Write [n, Hkv, bs, D] ``keys`` into ``pages`` in place (the inverse of
    ``page_keys``); values are left as they are."""
    head_size = keys.shape[-1]
    if key_order is None:
        pages[..., :head_size] = keys
        return
    n, num_kv_heads, block_size = pages.shape[:3]
    flat = pages.view(n, num_kv_heads, -1)[..., : block_size * head_size]
    flat.index_copy_(-1, key_order, keys.reshape(n, num_kv_heads, -1))


def block_lse_torch(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    ctx_lens: torch.Tensor,
    num_blocks: int,
    scale: float,
    key_order: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference: [R, Hq, D] query -> [R, Hq, num_blocks] fp32 block lse."""
    num_rows, num_heads, head_size = query.shape
    num_kv_heads, block_size = kv_cache.shape[1], kv_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.full(
        (num_rows, num_heads, num_blocks), float("-inf"), device=query.device
    )
    token = torch.arange(num_blocks * block_size, device=query.device)
    token = token.view(num_blocks, block_size)
    for lo in range(0, num_rows, _ROWS_PER_PASS):
        hi = min(num_rows, lo + _ROWS_PER_PASS)
        blocks = block_table[lo:hi, :num_blocks].long()
        keys = gather_keys(kv_cache, blocks.reshape(-1), head_size, key_order)
        keys = keys.view(hi - lo, num_blocks, num_kv_heads, block_size, head_size)
        q = query[lo:hi].float().view(hi - lo, num_kv_heads, group, head_size)
        logits = torch.einsum("rhgd,rnhtd->rhgnt", q, keys.float()) * scale
        valid = token[None] < ctx_lens[lo:hi, None, None]
        logits = logits.masked_fill(~valid[:, None, None], float("-inf"))
        out[lo:hi] = torch.logsumexp(logits, dim=-1).view(hi - lo, num_heads, -1)
    return out


def block_lse(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    ctx_lens: torch.Tensor,
    num_blocks: int,
    scale: float,
    key_order: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton kernel on CUDA, the torch reference elsewhere (or for CPU pages)."""
    if query.is_cuda and key_order is None:
        from vllm_specextend.retrieval.scoring_triton import block_lse_triton

        return block_lse_triton(
            query, kv_cache, block_table, ctx_lens, num_blocks, scale
        )
    return block_lse_torch(
        query, kv_cache, block_table, ctx_lens, num_blocks, scale, key_order
    )
