"""The draft's KV of a long prompt, only where its views will read it.

vLLM's draft model passes over every prompt token to write its KV: a 1B
draft's pass over a 32K prompt took ~230 ms on an H200, 16% of the first
token's time at batch 1, and eight of them put the last first token of a
batch 19% later (issue #45). Yet the draft only ever reads the sinks, a few
selected chunks and the recent window (``view.py``).

With ``draft_prompt_pool: N`` the passes over a long prompt's chunks are
dropped, and at the step that ends the prompt the target's scoring attention
ranks the prompt's chunks (``retriever.py``): the top ``N`` are the request's
*pool*. That step's first draft forward then takes, in place of the chunk the
target computed, the tokens of the sinks, the pool's chunks (in document
order) and the window, at their original positions, and reads them through a
view of exactly those blocks: one causal prefill of ~``N * chunk_size``
tokens that writes the draft's KV everywhere its views will look. Every later
selection chooses among the pool's chunks and those from the window's start
on (``allowed``), whose KV the draft writes as it decodes.

Where the step's other rows all decode (``tails``), each pooled pass runs
first, alone, and the step then drafts as a decode step from every row's last
K + 1 tokens: the captured routine replays it, where vLLM's eager path would
run the K - 1 further forwards at the host's pace (~25 ms a step in the
batch-8 first-token profile of 2026-11-29, the GPU idle for most of it).

Lossless either way: the target verifies every draft. The pooled KV saw only
the pool, so acceptance may change; the SmolLM2 grid measures it.

Pure torch and numpy; no vLLM import (``substitute`` replaces fields of the
``CommonAttentionMetadata`` it is handed, as ``View.apply`` does).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from vllm_specextend.retrieval.staging import copy_to


class PromptPools:
    """Per-slot pools: which chunks each request's draft KV holds.

    ``allowed[slot, c]``: chunk ``c`` may be selected (in the pool, or at or
    past the window's start when the pool was made); all True for a request
    whose prompt passed in full. ``chunks[slot]``: the pool, in document order.
    ``pooled[slot]`` (host): the request's prompt pass was pooled.
    """

    def __init__(self, num_slots: int, pool: int, max_chunks: int,
                 device: torch.device):
        self.pool = pool
        self.max_chunks = max_chunks
        self.allowed = torch.ones(num_slots, max_chunks, dtype=torch.bool,
                                  device=device)
        self.chunks = torch.zeros(num_slots, pool, dtype=torch.int32, device=device)
        self.pooled = np.zeros(num_slots, dtype=bool)
        self.unfilled = np.zeros(num_slots, dtype=np.int64)
        """(host) prompt chunks before each pool's window still without draft
        KV: ``draft_pool_fill`` grows a pool while some are left."""
        self._ids = torch.arange(max_chunks, device=device)

    def reset(self, slots: np.ndarray) -> None:
        """The requests in ``slots`` (re)start their prompt: no pool yet."""
        slots = np.asarray(slots)[self.pooled[slots]]
        if slots.size:
            self.pooled[slots] = False
            self.unfilled[slots] = 0
            index = copy_to(torch.from_numpy(slots), self.allowed.device)
            self.allowed.index_fill_(0, index, True)

    def put(self, slots: np.ndarray, slots_dev: torch.Tensor, chunks: torch.Tensor,
            window_chunk: torch.Tensor, unfilled: np.ndarray) -> None:
        """New pools: ``chunks`` [n, pool] in document order, ``window_chunk``
        [n] the first chunk of each window (all on the device); ``unfilled``
        [n] (host): the chunks before each window left out."""
        self.pooled[slots] = True
        self.unfilled[slots] = unfilled
        allowed = self._ids[None, :] >= window_chunk[:, None].long()
        allowed.scatter_(1, chunks.long(), True)
        self.allowed.index_copy_(0, slots_dev, allowed)
        self.chunks.index_copy_(0, slots_dev, chunks.to(torch.int32))

    def grow(self, slots: np.ndarray, slots_dev: torch.Tensor,
             chunks: torch.Tensor, unfilled: int) -> None:
        """``chunks`` [n, F] (device) join the pools of ``slots`` [n] (host;
        ``slots_dev`` the same on the device; distinct, a request a row: a
        repeated slot would keep one row's chunks); ``unfilled``: how many
        of a row's were chosen among those without draft KV
        (``draft_pool_fill``; the rest are context, which may have had it),
        by which the host's count of them drops. Gathered,
        scattered and copied back: an indexed assignment of a Python scalar
        copies it from pageable memory, a stream sync."""
        allowed = self.allowed.index_select(0, slots_dev)
        allowed.scatter_(1, chunks.long(), True)
        self.allowed.index_copy_(0, slots_dev, allowed)
        self.unfilled[slots] = np.maximum(0, self.unfilled[slots] - unfilled)


@dataclass
class PoolRows:
    """The rows of a step whose first draft forward is the pooled pass."""

    rows: np.ndarray  # [n] batch rows
    seq: np.ndarray  # [n] context after this step (the prompt's end)
    window_start: np.ndarray  # [n] first token of each row's window
    chunks: torch.Tensor  # [n, pool] the pool's chunk ids, document order
    sink_tokens: int
    chunk_size: int
    q_start: np.ndarray  # [n] first position the target computed this step
    full: np.ndarray | None = None
    """[n] bool: the row's query is its whole pooled pass (the default);
    False: its pass ran already (``pre_pass``) and its query is the part of
    its chunk inside the window only, read through its selection."""

    def __post_init__(self) -> None:
        if self.full is None:
            self.full = np.ones(self.rows.size, dtype=bool)

    def take(self, index) -> PoolRows:
        """Rows ``index`` (a slice, a bool mask or indices into these rows)
        only. The device's chunks are taken by an index copied from pinned
        memory: indexing them with the host's mask or list would copy it from
        pageable memory, a stream sync (``staging.copy_to``)."""
        at = np.arange(self.rows.size)[index]  # [m]
        chunks = self.chunks
        if not np.array_equal(at, np.arange(self.rows.size)):
            index = copy_to(torch.from_numpy(at), chunks.device)  # [m]
            chunks = chunks.index_select(0, index)
        return PoolRows(self.rows[at], self.seq[at], self.window_start[at], chunks,
                        self.sink_tokens, self.chunk_size, self.q_start[at],
                        self.full[at])

    def shifted(self, first: int) -> PoolRows:
        """The same rows counted from batch row ``first`` (a step cut in two,
        whose drafting part starts there)."""
        return PoolRows(self.rows - first, self.seq, self.window_start, self.chunks,
                        self.sink_tokens, self.chunk_size, self.q_start, self.full)

    def query_lens(self) -> np.ndarray:
        """Tokens of each row's query: sinks, pool and window for a full
        pooled pass; the chunk's part in the window otherwise. [n]"""
        pool = self.chunks.shape[1] * self.chunk_size
        window = self.seq - self.window_start
        return np.where(self.full, self.sink_tokens + pool + window,
                        np.minimum(window, self.seq - self.q_start))

    def positions(self, row: int) -> torch.Tensor:
        """Row ``row``'s query positions, in document order. [query_len]"""
        device = self.chunks.device
        seq = int(self.seq[row])
        if not self.full[row]:
            start = max(int(self.window_start[row]), int(self.q_start[row]))
            return torch.arange(start, seq, device=device)
        c = self.chunk_size
        pool = (self.chunks[row].long()[:, None] * c
                + torch.arange(c, device=device)[None, :]).flatten()
        return torch.cat([
            torch.arange(self.sink_tokens, device=device),
            pool,
            torch.arange(int(self.window_start[row]), seq, device=device),
        ])


def fit(pool: PoolRows, num_tokens: int, query_lens: np.ndarray, num_reqs: int,
        capacity: int) -> np.ndarray:
    """Which pooled rows run their pass within the step's first forward: in
    order, while the forward's tokens (``num_tokens`` now, each row's query
    replaced, one more per row for its next token) stay within the drafter's
    ``capacity``. The others run theirs first, each alone (``pre_pass``).
    ``query_lens``: the rows' query lengths now. [n] bool"""
    grown = pool.query_lens() - query_lens[pool.rows]
    rest = dataclasses.replace(pool, full=np.zeros(pool.rows.size, dtype=bool))
    shrunk = rest.query_lens() - query_lens[pool.rows]
    total = num_tokens + num_reqs + int(shrunk.sum())
    full = np.zeros(pool.rows.size, dtype=bool)
    for i in range(pool.rows.size):
        if total + grown[i] - shrunk[i] <= capacity:
            total += grown[i] - shrunk[i]
            full[i] = True
    return full


@dataclass
class FirstPassPositions:
    """Where the pooled rows' tokens sit in the draft's first forward.

    vLLM's draft model builds that forward's positions itself, each row's
    running on from its first token (``copy_and_expand_eagle_inputs_kernel``:
    a row's queries are contiguous there), and its slot mapping from them; a
    pooled row's are not. So after vLLM's ``set_inputs_first_pass`` the
    proposer writes these: the rows' tokens and next tokens at ``index`` of
    the forward take ``positions``, and slots through row ``rows``' table."""

    index: torch.Tensor  # [m] int64, tokens of the first forward
    positions: torch.Tensor  # [m] int64
    rows: torch.Tensor  # [m] int64, their rows of the batch
    slots: bool = True
    """False: the forward's table maps its own positions to these tokens'
    slots already (``pool_fill.fill_inputs``): only the positions change."""

    def real_slots(self, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
        """The tokens' KV slots through the real table. [m] int64"""
        blocks = block_table[self.rows, self.positions // block_size].long()
        return blocks * block_size + self.positions % block_size

    def apply(self, positions: torch.Tensor, cad, block_size: int) -> None:
        """Into the forward's position buffer and its metadata's slots."""
        positions[self.index] = self.positions.to(positions.dtype)
        if self.slots:
            cad.slot_mapping[self.index] = self.real_slots(
                cad.block_table_tensor, block_size).to(cad.slot_mapping.dtype)


def substitute(pool: PoolRows, prompt_ids: list[torch.Tensor], token_ids, positions,
               token_indices_to_sample, cad, block_size: int, extra_slots: int = 1):
    """The step's draft inputs with each pool row's query replaced by its
    pooled pass. ``prompt_ids[i]``: row ``pool.rows[i]``'s token ids up to its
    ``seq`` (on the device); ``extra_slots``: the tokens vLLM's draft model
    adds to each row of its first forward (the next token). Returns
    ``(token_ids, positions, token_indices_to_sample, cad, first_pass)``
    (``FirstPassPositions``); the other rows' tokens, and every row's
    distance from its query's end to its sampled token, are unchanged."""
    num_reqs = cad.num_reqs
    qsl_cpu = cad.query_start_loc_cpu[: num_reqs + 1]
    old_lens = np.diff(qsl_cpu.numpy())  # [num_reqs]
    new_lens = old_lens.copy()
    new_lens[pool.rows] = pool.query_lens()
    new_qsl = np.zeros(num_reqs + 1, dtype=np.int64)
    np.cumsum(new_lens, out=new_qsl[1:])
    which = dict(zip(pool.rows.tolist(), range(pool.rows.size)))
    tokens, pos, fixed = [], [], []
    for r in range(num_reqs):
        i = which.get(r)
        if i is None:
            start, stop = int(qsl_cpu[r]), int(qsl_cpu[r + 1])
            tokens.append(token_ids[start:stop])
            pos.append(positions[start:stop])
        else:
            p = pool.positions(i)
            tokens.append(prompt_ids[i][p].to(token_ids.dtype))
            pos.append(p.to(positions.dtype))
            # In the first forward: the row's tokens, then its next token.
            fixed.append((int(new_qsl[r]) + r * extra_slots, r, torch.cat(
                [p, torch.full((1,), int(pool.seq[i]), dtype=p.dtype,
                               device=p.device)])))
    token_ids = torch.cat(tokens)  # [num_tokens]
    positions = torch.cat(pos)  # [num_tokens]
    rows = torch.repeat_interleave(
        torch.arange(num_reqs, device=positions.device),
        copy_to(torch.from_numpy(new_lens), positions.device),
        output_size=int(new_qsl[-1]))
    table = cad.block_table_tensor
    slot_mapping = (table[rows, positions // block_size].long() * block_size
                    + positions % block_size).to(cad.slot_mapping.dtype)
    token_indices_to_sample, cad = _requeried(cad, new_lens, slot_mapping,
                                              token_indices_to_sample)
    device = positions.device
    first_pass = FirstPassPositions(
        index=torch.cat([start + torch.arange(p.numel(), device=device)
                         for start, _, p in fixed]),
        positions=torch.cat([p for _, _, p in fixed]).long(),
        rows=torch.cat([torch.full((p.numel(),), r, device=device)
                        for _, r, p in fixed]).long(),
    )
    return token_ids, positions, token_indices_to_sample, cad, first_pass


def tails(token_ids, positions, token_indices_to_sample, cad, length: int):
    """The step's draft inputs with every row's query cut to its last
    ``length`` tokens (each row has at least that many): a step whose pooled
    passes ran first (``pre_pass``) drafts as a decode step, rows of K + 1
    tokens. The draft rewrites its KV of a pooled row's last ``length``
    prompt tokens, as every decode step does for its rows' verified tokens.
    Returns ``(token_ids, positions, token_indices_to_sample, cad)``."""
    num_reqs = cad.num_reqs
    ends = cad.query_start_loc[1: num_reqs + 1].long()  # [num_reqs]
    index = (ends[:, None] - length + torch.arange(
        length, device=token_ids.device)[None, :]).flatten()  # [num_reqs * length]
    token_indices_to_sample, new = _requeried(
        cad, np.full(num_reqs, length, dtype=np.int64), cad.slot_mapping[index],
        token_indices_to_sample)
    return token_ids[index], positions[index], token_indices_to_sample, new


def _requeried(cad, new_lens: np.ndarray, slot_mapping, token_indices_to_sample):
    """``cad`` with each row's query now ``new_lens`` tokens ([num_reqs], on
    the host) at ``slot_mapping``'s slots, its contexts unchanged, and
    ``token_indices_to_sample`` moved so that each row samples as far from its
    query's end as before: ``substitute``'s and ``tails``' metadata. Returns
    ``(token_indices_to_sample, cad)``."""
    num_reqs = cad.num_reqs
    old_lens = np.diff(cad.query_start_loc_cpu[: num_reqs + 1].numpy())  # [num_reqs]
    new_qsl = np.zeros(num_reqs + 1, dtype=np.int64)
    np.cumsum(new_lens, out=new_qsl[1:])
    qsl_cpu = torch.from_numpy(new_qsl.astype(np.int32))
    qsl = copy_to(qsl_cpu, cad.query_start_loc.device)
    if token_indices_to_sample is not None:
        back = cad.query_start_loc[1: num_reqs + 1] - token_indices_to_sample
        token_indices_to_sample = (qsl[1:] - back).to(token_indices_to_sample.dtype)
    computed = None
    if cad._num_computed_tokens_cpu is not None:
        computed = (cad._num_computed_tokens_cpu
                    - torch.from_numpy(new_lens - old_lens).to(torch.int32))
    return token_indices_to_sample, cad.replace(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl_cpu,
        num_actual_tokens=int(new_qsl[-1]),
        max_query_len=int(new_lens.max()),
        slot_mapping=slot_mapping,
        positions=None,
        logits_indices_padded=None,
        num_logits_indices=None,
        _num_computed_tokens_cpu=computed,
        _num_computed_tokens_cache=None,
    )
