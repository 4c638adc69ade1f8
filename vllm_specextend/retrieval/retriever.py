"""The retriever: chooses the chunks of the rows the planner sends it.

For each row: the query of its last accepted token, captured from the
target's scoring attention layer during verification (``score_layer``: the
final one unless set), is scored against that layer's paged keys
(``scoring.block_lse``: one log-sum-exp per KV block and query head), turned
into attention mass per chunk (``selection.chunk_mass``), averaged over all
heads across tensor-parallel ranks, and the ``top_k`` chunks
between the sinks and the window start are kept (``selection.select_chunks``).
Everything after the host's row list stays on the device; the chosen ids go
straight into the selection state's device buffer.

Tensor parallel: each rank holds a shard of the heads, so masses are summed
over ranks, and rank 0's choice is broadcast so that every rank drafts from
the same view even if the reductions differ in the last bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_specextend import compat
from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.retrieval.planner import BatchLens, ScoreRequest
from vllm_specextend.retrieval.scoring import block_lse
from vllm_specextend.retrieval.selection import (
    choose_fill,
    chunk_mass,
    fill_context,
    followed_mass,
    num_candidates,
    pool_follow,
    select_chunks,
    with_predecessors,
)
from vllm_specextend.retrieval.staging import HostStaging
from vllm_specextend.retrieval.state import SelectionState
from vllm_specextend.serving.stats import SpecExtendStats


@dataclass
class FillRows:
    """The rows of a step whose pool grows before it drafts."""

    rows: np.ndarray  # [m] batch rows
    prompt_end: np.ndarray  # [m] tokens from which no chunk is filled (host)
    chunks: torch.Tensor  # [m, F] int32, chunk ids in document order (device)

    def take(self, rows: slice) -> FillRows:
        """Rows ``rows`` only (a slice: the device's ids need no index)."""
        return FillRows(self.rows[rows], self.prompt_end[rows], self.chunks[rows])


class Retriever:
    def __init__(self, cfg: SpecExtendConfig, state: SelectionState,
                 staging: HostStaging, device: torch.device):
        self.cfg = cfg
        self.state = state
        self.staging = staging
        self.device = device
        self.layer = None  # the target's scoring layer (cfg.score_layer)
        self.query_buf: torch.Tensor | None = None  # [max_num_tokens, Hq, D]
        self.capturing = True
        self.tp_size = 1
        self._key_order: torch.Tensor | None = None
        self.pools = None  # prompt_pool.PromptPools, with draft_prompt_pool
        # Chunks after each top chunk that its pool takes along (``followed_mass``;
        # ``selection.pool_follow``, an experiment's switch).
        self.pool_follow = pool_follow()
        self.fill_context = fill_context()
        self.pool_context = fill_context("SPECEXTEND_POOL_CONTEXT")
        self.fill_follow = pool_follow("SPECEXTEND_FILL_FOLLOW")

    def attach(self, layer, max_num_tokens: int, dtype: torch.dtype,
               tp_size: int) -> None:
        """Score against ``layer``'s keys; capture its queries from now on."""
        self.layer = layer
        self.tp_size = tp_size
        self.query_buf = torch.zeros(
            max_num_tokens, layer.num_heads, layer.head_size,
            dtype=dtype, device=self.device,
        )
        compat.wrap_query_capture(layer, self._capture_query)

    def _capture_query(self, query: torch.Tensor) -> None:
        # Off while a target drafts for itself: its draft forwards go through
        # the same layer, and the retriever needs the verification's queries.
        if not self.capturing:
            return
        buf = self.query_buf
        n = min(query.shape[0], buf.shape[0])
        buf[:n].copy_(query[:n].view(n, buf.shape[1], buf.shape[2]))

    def retrieve(self, request: ScoreRequest, lens: BatchLens, slots: np.ndarray,
                 slots_dev: torch.Tensor, cad, token_indices_to_sample,
                 num_rejected, stats: SpecExtendStats) -> FillRows | None:
        """Chooses the rows' chunks; returns the rows whose prompt pool
        grows this step (``draft_pool_fill``), or None."""
        cfg = self.cfg
        rows_np = request.rows
        timer = stats.start_timer(self.device)
        num_chunks_total = num_candidates(cfg, request.window_start)
        num_selected = np.minimum(cfg.top_k, num_chunks_total)
        hi = request.window_start // cfg.chunk_size
        lo = np.full_like(hi, cfg.sink_tokens // cfg.chunk_size)
        if token_indices_to_sample is None:
            last = cad.query_start_loc_cpu[1:].numpy()[rows_np] - 1
            rows, lo_d, hi_d, last_d = self.staging.to_device(rows_np, lo, hi, last)
            query_rows = last_d
        else:
            rows, lo_d, hi_d = self.staging.to_device(rows_np, lo, hi)
            query_rows = token_indices_to_sample[rows]
        ctx_lens = cad.seq_lens[rows]
        if num_rejected is not None:
            ctx_lens = ctx_lens - num_rejected[rows]
        mass = self.chunk_masses(
            query_rows, cad.block_table_tensor[rows], ctx_lens,
            int(lens.seq[rows_np].max()),
        )  # [n, num_chunks]
        allowed, fill = None, None
        if self.pools is not None:
            self._choose_pools(request, mass, lo_d, hi_d, slots, slots_dev[rows])
            fill = self._choose_fill(request, lens, mass, lo, slots, slots_dev[rows])
            allowed = self.pools.allowed[slots_dev[rows]]
        selected = select_chunks(mass, lo_d, hi_d, min(cfg.top_k, mass.shape[1]),
                                 allowed)
        if self.tp_size > 1:
            selected = compat.tp_broadcast(selected.contiguous())
        self.state.put(
            slots[rows_np], request.window_start, num_selected, selected,
            slots_dev[rows],
        )
        stats.retrievals += int(rows_np.size)
        stats.retrieval_steps += 1
        stats.stop_timer(timer)
        return fill

    def _choose_pools(self, request: ScoreRequest, mass, lo_d, hi_d, slots,
                      slots_dev) -> None:
        """The pools of the rows that end a pooled prompt: their top
        ``draft_prompt_pool`` chunks, from the same masses as the selection."""
        pool = request.pool
        if pool is None or not pool.any():
            return
        (at,) = self.staging.to_device(np.flatnonzero(pool))  # no sync: staging.py
        size, pooled = self.pools.pool, mass[at]
        if self.pool_context:  # half the pool, each with the chunk before it
            size -= size // 2
        chunks = select_chunks(followed_mass(pooled, self.pool_follow), lo_d[at],
                               hi_d[at], size)
        if self.pool_context:
            none = torch.zeros_like(pooled, dtype=torch.bool)
            chunks = with_predecessors(pooled, lo_d[at], hi_d[at], none,
                                       chunks)[:, -self.pools.pool:]
        if self.tp_size > 1:
            chunks = compat.tp_broadcast(chunks.contiguous())
        window_chunk = hi_d[at]
        unfilled = np.maximum(0, num_candidates(self.cfg, request.window_start[pool])
                              - self.pools.pool)
        self.pools.put(slots[request.rows[pool]], slots_dev[at], chunks, window_chunk,
                       unfilled)

    def _choose_fill(self, request: ScoreRequest, lens: BatchLens, mass, lo, slots,
                     slots_dev) -> FillRows | None:
        """The rows whose pool grows (``draft_pool_fill``): pooled requests
        refreshing past their prompt's end, with chunks still without draft KV
        and enough prompt chunks left of their window; their chunks to fill
        join the pool (``allowed``). ``choose_fill`` takes those without KV
        first, so the host's count of them (``PromptPools.unfilled``) stays
        exact; with ``fill_context`` an upper bound (a predecessor may have
        had KV), so a pool may grow by chunks it held once all have KV."""
        count, size = self.cfg.draft_pool_fill, self.cfg.chunk_size
        if count is None:
            return None
        width = 2 * count if self.fill_context else count  # chunks a row fills
        rows = request.rows
        ended = np.zeros(rows.size, dtype=bool) if request.pool is None else request.pool
        prompt_end = np.minimum(request.window_start // size * size,
                                lens.num_prompt[rows] // size * size)
        grow = (self.pools.pooled[slots[rows]] & ~ended
                & (self.pools.unfilled[slots[rows]] > 0)
                & (prompt_end // size - lo >= width))
        if not grow.any():
            return None
        at = np.flatnonzero(grow)
        at_d, hi_d = self.staging.to_device(at, prompt_end[at] // size)
        lo_d = torch.full_like(hi_d, int(lo[0]))  # the sinks' chunks, every row
        slot_d = slots_dev[at_d]
        has_kv = self.pools.allowed[slot_d]
        ranked = followed_mass(mass[at_d], self.fill_follow)
        chunks = choose_fill(ranked, lo_d, hi_d, has_kv, count)
        if self.fill_context:
            chunks = with_predecessors(ranked, lo_d, hi_d, has_kv, chunks)
        if self.tp_size > 1:
            chunks = compat.tp_broadcast(chunks.contiguous())
        self.pools.grow(slots[rows[at]], slot_d, chunks, count)
        return FillRows(rows[at], prompt_end[at], chunks)

    def chunk_masses(self, query_rows: torch.Tensor, block_table: torch.Tensor,
                     ctx_lens: torch.Tensor, max_ctx: int) -> torch.Tensor:
        """The scoring layer's attention mass per chunk, [n, num_chunks] fp32:
        the captured queries at ``query_rows`` ([n]) over the first
        ``ctx_lens`` ([n]) tokens of ``block_table`` ([n, max_blocks]), all on
        the device, averaged over every head of every tensor-parallel rank.
        ``max_ctx`` bounds ``ctx_lens`` on the host."""
        lse = self._block_lse(query_rows, block_table, ctx_lens, max_ctx)
        mass = chunk_mass(lse, self.cfg.chunk_size // self.block_size)
        if self.tp_size > 1:
            mass = compat.tp_all_reduce(mass) / self.tp_size
        return mass

    def _block_lse(self, query_rows, block_table, ctx_lens, max_ctx) -> torch.Tensor:
        """Per-block log-sum-exp of the captured queries at ``query_rows``:
        [n, Hq, num_blocks] fp32 (``scoring.block_lse``)."""
        kv_cache = compat.layer_kv_cache(self.layer)
        if kv_cache.device.type == "cpu" and self._key_order is None:
            self._key_order = compat.cpu_key_order(
                self.layer, kv_cache.shape[2], kv_cache.dtype
            )
        return block_lse(
            self.query_buf[query_rows.long()],  # [n, Hq, D]
            kv_cache,
            block_table,
            ctx_lens.to(torch.int32),
            -(-max_ctx // kv_cache.shape[2]),  # blocks
            self.layer.impl.scale,
            self._key_order,
        )

    @property
    def block_size(self) -> int:
        return compat.layer_kv_cache(self.layer).shape[2]

    def warm_up(self, max_chunks: int) -> None:
        """Score a one-token context once, before the first request, so the
        scoring kernel is compiled then: Triton compiles on first call, and
        vLLM's JIT monitor found that call (~1-2 s on an H100/H200) inside a
        server's first request. Same calls as a retrieval, so the same kernel
        specialisation; no collective (each rank compiles its own).

        Then the selection's torch kernels (log-sum-exp, top-k, sort) at a
        step's shapes, ``max_chunks`` chunks a row and the config's k: CUDA
        loads a kernel's module on its first launch (lazy loading, torch's
        default). Warming the scoring kernel alone, a server's first
        retrieval counted ~148 ms of scoring time against 0.2 ms later; with
        these, 0.3 ms (H200 serve logs, 2026-11-29, docs/results.md)."""
        one = torch.zeros(1, dtype=torch.int64, device=self.device)  # [1]
        # [1, 16]: a row stride that is a multiple of 16, as a real table's.
        table = torch.zeros(1, 16, dtype=torch.int32, device=self.device)
        ctx = torch.ones(1, dtype=torch.int32, device=self.device)  # [1]
        self._block_lse(one, table, ctx, 1)
        per_chunk = self.cfg.chunk_size // self.block_size
        lse = torch.zeros(1, self.layer.num_heads, max_chunks * per_chunk,
                          device=self.device)  # [1, Hq, num_blocks]
        mass = chunk_mass(lse, per_chunk)  # [1, max_chunks]
        lo = torch.zeros(1, dtype=torch.int64, device=self.device)  # [1]
        hi = torch.full((1,), max_chunks, dtype=torch.int64, device=self.device)
        allowed = None
        if self.pools is not None:  # as retrieve: the pool, then the top-k in it
            select_chunks(mass, lo, hi, min(self.pools.pool, max_chunks))
            allowed = self.pools.allowed[:1]
        select_chunks(mass, lo, hi, min(self.cfg.top_k, max_chunks), allowed)

    def reset(self) -> None:
        self._key_order = None
