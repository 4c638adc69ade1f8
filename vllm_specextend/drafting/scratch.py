"""Scratch KV blocks for compacted draft positions.

Compaction (``rope.py``) needs the sink and selected-chunk keys of a request
re-rotated to new positions. Those copies cannot go into the real blocks: prefix
caching shares them between requests, and later views (other chunks, other
offsets) need them as cached. So every draft attention layer gets extra KV
blocks past the pool the scheduler manages (``compat.add_kv_blocks``), and each
request slot of the selection state owns a fixed run of them (``compactor``). Their bytes come out of vLLM's
KV cache budget (``scratch_nbytes``, the worker's ``determine_available_memory``).

Pure torch; no vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from vllm_specextend.drafting.rope import shift_keys
from vllm_specextend.retrieval.scoring import page_keys, set_page_keys


def scratch_nbytes(
    pages: Iterable[tuple[int, int]], tokens_per_request: int, num_runs: int
) -> int:
    """Bytes of ``num_runs`` runs of ``tokens_per_request`` tokens in every layer.

    ``pages`` holds each layer's (bytes, tokens) per KV block. Runs are rounded
    up to whole blocks, so this bounds the allocation for any kernel block size
    that divides the run.
    """
    return num_runs * sum(
        -(-tokens_per_request // tokens) * nbytes for nbytes, tokens in pages
    )


def copy_shifted(
    kv_caches: list[torch.Tensor],
    key_orders: list[torch.Tensor | None],
    src: torch.Tensor,
    dst: torch.Tensor,
    delta: torch.Tensor,
    inv_freq: torch.Tensor,
    is_neox: bool,
    head_size: int,
) -> None:
    """Copy whole KV pages ``src`` -> ``dst`` ([n] int64 physical blocks) in
    every layer, their keys re-rotated by ``delta`` [n] positions on the way
    (one read of the sources, one write of the copies)."""
    for kv_cache, key_order in zip(kv_caches, key_orders, strict=True):
        pages = kv_cache.index_select(0, src)
        keys = page_keys(pages, head_size, key_order)
        set_page_keys(pages, shift_keys(keys, delta, inv_freq, is_neox), key_order)
        kv_cache.index_copy_(0, dst, pages)
