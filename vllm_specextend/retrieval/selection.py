"""Chunk-selection policy: which context chunks the draft keeps.

A request's context is cut into ``chunk_size``-token chunks from token 0. The
draft's working set is: the sink chunks, up to ``top_k`` chunks chosen by the
target's scoring-layer attention mass, and a recent window starting at a
chunk boundary. The window start is fixed at each retrieval and the window then
grows with every new token until the next retrieval, so generated text stays
visible (as in the SpecExtend reference) and every query of a step is inside it.

Pure torch; no vLLM.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.config.switches import env_count, env_flag


def window_start(cfg: SpecExtendConfig, anchor):
    """First token of the recent window for queries starting at ``anchor``.

    Chunk-aligned, never inside the sinks, and at most ``anchor``. ``anchor``
    is an int or an int array (one per row).
    """
    start = (anchor - cfg.window_tokens) // cfg.chunk_size * cfg.chunk_size
    if isinstance(start, int):
        return max(cfg.sink_tokens, start)
    return np.maximum(cfg.sink_tokens, start)


def num_candidates(cfg: SpecExtendConfig, start):
    """Chunks between the sinks and the window start, i.e. retrievable ones."""
    n = start // cfg.chunk_size - cfg.sink_tokens // cfg.chunk_size
    return max(0, n) if isinstance(n, int) else np.maximum(0, n)


def uses_view(cfg: SpecExtendConfig, start):
    """Whether the restricted view drops anything for a window at ``start``."""
    if cfg.policy == "full":
        return False if isinstance(start, int) else np.zeros_like(start, dtype=bool)
    if cfg.policy == "streaming":
        return start > cfg.sink_tokens
    return num_candidates(cfg, start) > cfg.top_k


def chunk_mass(block_lse: torch.Tensor, blocks_per_chunk: int) -> torch.Tensor:
    """Attention mass per chunk from per-block log-sum-exps.

    block_lse: [R, H, num_blocks] fp32, -inf for blocks past the context.
    Returns [R, num_blocks // blocks_per_chunk] fp32: softmax over the whole
    context per head, summed inside the chunk, averaged over heads (GQA-aware
    because every query head carries its own lse). Trailing blocks that do not
    fill a chunk are dropped: they are never retrievable (always in the window).
    """
    num_rows, num_heads, num_blocks = block_lse.shape
    total = torch.logsumexp(block_lse, dim=-1, keepdim=True)
    mass = torch.exp(block_lse - total).mean(dim=1)
    num_chunks = num_blocks // blocks_per_chunk
    mass = mass[:, : num_chunks * blocks_per_chunk]
    return mass.view(num_rows, num_chunks, blocks_per_chunk).sum(dim=-1)


def select_chunks(
    mass: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, k: int,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """Top-k chunk ids per row among ids in [lo, hi), in document order.

    mass: [R, C] fp32; lo, hi: [R] int (same device); allowed: [R, >= C] bool,
    the only ids a row may pick besides the range (a prompt pool,
    ``prompt_pool.py``), or None. Returns [R, k] int32. Rows with fewer than k
    candidates carry their valid ids first; the caller knows each row's count
    (``min(k, hi - lo)``, at most its allowed ids) and ignores the rest.
    """
    ids = torch.arange(mass.shape[1], device=mass.device)
    valid = (ids[None, :] >= lo[:, None]) & (ids[None, :] < hi[:, None])
    if allowed is not None:
        valid &= allowed[:, : mass.shape[1]]
    masked = torch.where(valid, mass, torch.full_like(mass, -1.0))
    top = torch.topk(masked, k, dim=1).indices
    # Invalid picks sort last so each row's first min(k, hi - lo) ids are valid.
    picked_valid = torch.gather(valid, 1, top)
    key = torch.where(picked_valid, top, top + mass.shape[1])
    return torch.sort(key, dim=1).values.to(torch.int32)


def choose_fill(mass: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                has_kv: torch.Tensor, count: int) -> torch.Tensor:
    """The ``count`` chunks in ``[lo, hi)`` to fill per row, in document
    order: the top ones by ``mass`` among those without draft KV, then, where
    fewer are left, the top ones with it. ``mass`` [R, C] fp32 (attention
    mass, 0 to 1); ``lo``, ``hi`` [R] int; ``has_kv`` [R, >= C] bool. Each
    row has at least ``count`` chunks in range (the caller checks on the
    host). Returns [R, count] int32."""
    ids = torch.arange(mass.shape[1], device=mass.device)[None, :]
    in_range = (ids >= lo[:, None]) & (ids < hi[:, None])
    top = torch.topk(_fill_key(mass, has_kv, in_range), count, dim=1).indices
    return torch.sort(top, dim=1).values.to(torch.int32)


def _fill_key(mass: torch.Tensor, has_kv: torch.Tensor,
              valid: torch.Tensor) -> torch.Tensor:
    """The fill's order, [R, C]: chunks without draft KV by ``mass`` in
    [0, 1], then those with it in [-2, -1], chunks not ``valid`` -3."""
    key = torch.where(has_kv[:, : mass.shape[1]], mass - 2.0, mass)
    return torch.where(valid, key, torch.full_like(mass, -3.0))


def with_predecessors(mass: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                      has_kv: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The fill's ``chosen`` chunks [R, F] with the chunk before each as its
    context, [R, 2F] int32 in document order: a chunk's draft KV computed
    without the text before it lost the local context its first tokens
    carry (the end of a line, the open bracket), which a copy's draft reads
    at every chunk boundary. A predecessor below ``lo`` (a sink, in the
    fill's table already) or already in ``chosen`` leaves its place to the
    next chunks ``choose_fill``'s order would take, so the count stays fixed
    (no sync) and no chunk is queried twice. Each row has at least ``2F``
    chunks in ``[lo, hi)`` (the caller checks on the host)."""
    rows, num = mass.shape
    count = chosen.shape[1]
    ids = torch.arange(num, device=mass.device)[None, :]
    picked = torch.zeros(rows, num + 1, dtype=torch.bool, device=mass.device)
    picked.scatter_(1, chosen.long(), True)
    before = chosen.long() - 1
    before = torch.where(before >= lo[:, None], before, torch.full_like(before, num))
    picked.scatter_(1, before, True)  # column ``num``: none
    picked = picked[:, :num]
    need = 2 * count - picked.sum(dim=1)  # [R], 0 .. F
    free = (ids >= lo[:, None]) & (ids < hi[:, None]) & ~picked
    extra = torch.topk(_fill_key(mass, has_kv, free), count,
                       dim=1).indices  # [R, F], best first
    take = torch.arange(count, device=mass.device)[None, :] < need[:, None]
    picked = torch.cat([picked, torch.zeros_like(picked[:, :1])], dim=1)
    picked.scatter_(1, torch.where(take, extra, torch.full_like(extra, num)), True)
    top = torch.topk(picked[:, :num].float(), 2 * count, dim=1).indices
    return torch.sort(top, dim=1).values.to(torch.int32)


def followed_mass(mass: torch.Tensor, follow: int) -> torch.Tensor:
    """Each chunk scored by the most mass among itself and the ``follow``
    chunks before it, [R, C] fp32, ties broken by its own mass: a pool chosen
    by it holds the runs of text after the chunks the target attends to most,
    which an answer that copies its input reads next (the function body after
    its name, the paragraph after its opening). ``follow`` 0: ``mass``."""
    if follow <= 0:
        return mass
    padded = torch.nn.functional.pad(mass, (follow, 0), value=-1.0)
    spread = torch.nn.functional.max_pool1d(padded[:, None, :], follow + 1, stride=1)
    return spread[:, 0, :] + mass * 1e-3


def held_chunks(
    num_chunks: int,
    sink_chunks: int,
    window_chunk: torch.Tensor,
    selected_chunks: torch.Tensor,
    num_selected: torch.Tensor,
) -> torch.Tensor:
    """Which chunks a draft's working set holds, [R, num_chunks] bool.

    window_chunk:    [R] int, first chunk of the recent window (0: the whole
                     context, as for a row drafting without a view).
    selected_chunks: [R, K] int, chunk ids, the first ``num_selected`` valid.
    num_selected:    [R] int.
    The sinks, the selected chunks and everything from the window on.
    """
    ids = torch.arange(num_chunks, device=window_chunk.device)[None, :]
    held = (ids < sink_chunks) | (ids >= window_chunk[:, None])
    k = selected_chunks.shape[1]
    if k:
        valid = torch.arange(k, device=window_chunk.device)[None, :] < num_selected[:, None]
        picked = torch.where(valid, selected_chunks.long(), torch.full_like(
            selected_chunks, num_chunks, dtype=torch.long))  # num_chunks: none
        hits = torch.zeros(held.shape[0], num_chunks + 1, dtype=torch.bool,
                           device=held.device)
        hits.scatter_(1, picked, True)
        held |= hits[:, :num_chunks]
    return held


def fill_context(name: str = "SPECEXTEND_FILL_CONTEXT") -> bool:
    """``SPECEXTEND_FILL_CONTEXT=1``: each chunk ``draft_pool_fill`` adds
    comes with the chunk before it (``with_predecessors``), twice the fill's
    tokens (the config's checks of the fill against the step budget and the
    draft's graphs count ``draft_pool_fill`` chunks, not twice: an
    experiment for budgets that hold both); ``SPECEXTEND_POOL_CONTEXT=1``: a
    prompt pool is its top half's chunks, each with the chunk before it (an
    odd pool drops its first chunk, which may be a chosen one).
    Experiments on the real pair's copy tasks (realpair modes
    ``spec_extend_fillctx``, ``spec_extend_ctx``), read from the workers'
    environment."""
    return env_flag(name, "each chunk with the one before it")


def pool_follow(name: str = "SPECEXTEND_POOL_FOLLOW") -> int:
    """``SPECEXTEND_POOL_FOLLOW=N``: a prompt pool (``draft_prompt_pool``)
    chosen by ``followed_mass``, each top chunk with the ``N`` after
    it (default 0: the top chunks alone); ``SPECEXTEND_FILL_FOLLOW=N``: the
    fill's chunks (``draft_pool_fill``) so, where a copy reads next.
    Experiments on copy tasks with the real pair (``benchmarks/realpair``),
    read from the workers' environment on any device."""
    return env_count(name, 0, unit="chunks")
