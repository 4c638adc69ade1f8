"""Scratch KV blocks for compacted draft positions.

Compaction (``rope.py``) needs the sink and selected-chunk keys of a request
re-rotated to new positions. Those copies cannot go into the real blocks: prefix
caching shares them between requests, and later views (other chunks, other
offsets) need them as cached. So every draft attention layer gets extra KV
blocks past the pool the scheduler manages (``compat.add_kv_blocks``), and each
live request owns a fixed run of them, freed like its selection when the
request finishes, is aborted or is preempted. Their bytes come out of vLLM's
KV cache budget (``scratch_nbytes``, the worker's ``determine_available_memory``).

Pure torch; no vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from vllm_specextend.rope import shift_keys
from vllm_specextend.scoring import page_keys, set_page_keys


class ScratchBlocks:
    """req_id -> first block of its run of ``blocks_per_request`` scratch blocks."""

    def __init__(self, first_block: int, blocks_per_request: int, num_runs: int):
        self.first_block = first_block
        self.blocks_per_request = blocks_per_request
        self.num_runs = num_runs
        self._owner: dict[str, int] = {}
        self._free = list(range(num_runs - 1, -1, -1))

    def __len__(self) -> int:
        return len(self._owner)

    def run_of(self, req_id: str) -> int:
        """First scratch block of ``req_id``, assigning a free run on first use."""
        run = self._owner.get(req_id)
        if run is None:
            if not self._free:
                raise RuntimeError(
                    f"vllm-specextend: all {self.num_runs} scratch runs are taken; "
                    "a finished request was never released."
                )
            run = self._owner[req_id] = self._free.pop()
        return self.first_block + run * self.blocks_per_request

    def release(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            run = self._owner.pop(req_id, None)
            if run is not None:
                self._free.append(run)

    def sweep(self, live_req_ids: Iterable[str]) -> None:
        live = set(live_req_ids)
        self.release([r for r in self._owner if r not in live])


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
    for kv_cache, key_order in zip(kv_caches, key_orders):
        pages = kv_cache.index_select(0, src)
        keys = page_keys(pages, head_size, key_order)
        set_page_keys(pages, shift_keys(keys, delta, inv_freq, is_neox), key_order)
        kv_cache.index_copy_(0, dst, pages)
