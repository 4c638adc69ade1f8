"""The draft's pass over a prompt, windowed inside a chunk (``draft_prefill_window``).

Why: the draft's first forward over a prompt chunk attends to the whole
context, so its cost grows with the square of the prompt. On the real pair
(docs/evaluation.md, "The draft's pass over a prompt") the 0.5B's pass over
a 30K prompt costs ~140 ms, two thirds of it attention, most of the gap to
the 30K goal. A window per *chunk* barely helps: ``LLM``'s 16,384-token
budget makes a 16K prompt one chunk, and a 30K prompt two.

How: in the attention metadata of that first forward only, each long prompt
row is cut into sub-rows of ``PIECE_TOKENS`` queries, and each sub-row reads
the sinks and the ``window`` tokens before it, through a block-table view of
the real table (as ``view.build_view`` gathers a step's view). Tokens,
positions and the slot mapping do not change: one forward, every token's
draft KV written where it always is, attention linear in the prompt's length.
Each sub-row's queries are the last tokens of its view, so bottom-right
causal masking stays exact inside it. A row that samples (its chunk ends the
prompt) keeps its last token as a sub-row of its own that reads the row as
the step's view has it (the whole context on a fresh prompt): the first
draft token reads everything. The later draft forwards keep the real rows.

What it costs: draft KV of prompt tokens computed from the sinks and a
window, an approximation the target never sees (verification is unchanged,
so output stays lossless); acceptance to be measured on the real pair
before it becomes a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from vllm_specextend.config.switches import env_count
from vllm_specextend.drafting.deferral import SHARED
from vllm_specextend.drafting.view import View, build_view

PIECE_TOKENS = 1024
"""Queries per sub-row. Attention reads ``window + PIECE_TOKENS / 2`` keys a
query on average; shorter pieces add sub-rows (FlashAttention's work per row
is small beside a piece's)."""


def piece_tokens() -> int:
    """``PIECE_TOKENS``, or ``SPECEXTEND_PROMPT_PIECE=N``: an experiment
    switch (``benchmarks/realpair``) and the CPU tests' short prompts, read
    from the workers' environment."""
    return env_count("SPECEXTEND_PROMPT_PIECE", PIECE_TOKENS, 1, unit="tokens")


@dataclass
class PromptSplit:
    """Which rows of a step's first draft forward are cut, where their
    queries start, and the step's piece size. [num_reqs] host arrays, the
    step's rows in order; a part of the step (``rows``: a kept pass, a cut
    step's drafting rows) keeps the step's piece, so it cuts as the step."""

    q_start: np.ndarray  # int64, the first position each row computes
    prompt: np.ndarray  # bool, the row computes prompt tokens
    samples: np.ndarray  # bool, the row's drafts are used (its last token exact)
    window: int  # tokens before each piece it reads, past the sinks
    sink_blocks: int
    block_size: int
    piece: int = PIECE_TOKENS
    stats: object = dataclasses.field(default=None, metadata=SHARED)
    """SpecExtendStats: counts prompt_pieces; a kept pass's copy shares it."""

    @classmethod
    def for_step(cls, q_lens: np.ndarray, max_rows: int, **fields) -> PromptSplit | None:
        """The split of a step whose rows compute ``q_lens`` tokens each
        ([num_reqs], host), with the longest piece that keeps its sub-rows
        within ``max_rows`` (vLLM's attention buffers,
        ``compat.attention_row_limit``); None where no row is long enough.
        Counted with one query more a row: the draft's first forward can
        add one (vLLM's ``extra_slots_per_request``), never fewer."""
        split = cls(**fields)
        qsl = np.concatenate([[0], np.cumsum(q_lens + 1)])
        while True:
            sub = split._plan(qsl, split.piece)
            if sub is None:
                return None
            if sub.src.size <= max_rows:
                return split
            split.piece *= 2  # fewer, longer pieces

    def rows(self, start: int, stop: int) -> PromptSplit:
        """The split of rows ``start:stop`` only (a step cut in two)."""
        return dataclasses.replace(
            self, q_start=self.q_start[start:stop], prompt=self.prompt[start:stop],
            samples=self.samples[start:stop])

    def plan(self, query_start_loc: np.ndarray) -> SubRows | None:
        """The sub-rows for a first forward whose rows start their queries at
        ``query_start_loc`` ([num_reqs + 1], host); None where no row is
        long enough to cut."""
        return self._plan(query_start_loc, self.piece)

    def _plan(self, qsl: np.ndarray, piece: int) -> SubRows | None:
        bs = self.block_size
        sink_end = self.sink_blocks * bs
        q_lens = np.diff(qsl)
        cut = self.prompt & (q_lens > 2 * piece)
        if not cut.any():
            return None
        subs = []  # (row, queries, first window block or -1, end position)
        for r, q in enumerate(q_lens.tolist()):
            start = int(self.q_start[r])
            end = start + q
            last = end - 1 if self.samples[r] else end
            # The queries whose window would reach the sinks read the whole
            # context, as one sub-row; pieces from the first one past it.
            s = max(start, sink_end + self.window + bs)
            if not cut[r] or s >= last:  # no piece would drop a block: as it is
                subs.append((r, q, -1, 0))
                continue
            if s > start:  # its head: reads from the sinks on, dropping nothing
                subs.append((r, s - start, self.sink_blocks, s))
            while s < last:  # pieces: each window past the sinks' block
                t = min(s + piece, last)
                subs.append((r, t - s, (s - self.window) // bs, t))
                s = t
            if last < end:  # the sampled token reads the row as the step's view has it
                subs.append((r, 1, -1, 0))
        src, lens, window_block, ends = (
            np.asarray(column, dtype=np.int64) for column in zip(*subs, strict=True))
        if not (window_block >= 0).any():
            return None
        offsets = (window_block - self.sink_blocks) * bs
        return SubRows(src, lens, window_block,
                       np.where(window_block >= 0, ends - offsets, 0))

    def apply(self, real, viewed):
        """The first forward's metadata: ``viewed`` (vLLM's ``real`` metadata
        through the step's view, or ``real`` itself) with its cut rows as
        sub-rows, their tables gathered from ``real``'s block table."""
        if any(getattr(real, name, None) is not None for name in _PER_ROW_UNCUT):
            return viewed  # per-row fields this split does not cut (below)
        qsl = real.query_start_loc_cpu[: real.num_reqs + 1].numpy()
        sub = self.plan(qsl)
        if sub is None:
            return viewed
        if self.stats is not None:  # pieces that drop blocks (not a row's head)
            self.stats.prompt_pieces += int((sub.window_block > self.sink_blocks).sum())
        device = real.query_start_loc.device
        n = sub.src.size
        qsl_new = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(sub.lens, out=qsl_new[1:])
        qsl_new += int(qsl[0])
        packed = torch.from_numpy(np.concatenate([
            qsl_new, sub.src, np.maximum(sub.window_block, self.sink_blocks),
            sub.seq_lens, (sub.window_block >= 0)]).astype(np.int32))
        if device.type == "cuda":
            packed = packed.pin_memory()
        packed = packed.to(device, non_blocking=True)
        qsl_d, src_d, block_d, seq_d, windowed_d = packed.split([n + 1, n, n, n, n])
        src_d = src_d.long()
        windowed_d = windowed_d.bool()
        real_table = real.block_table_tensor[src_d]
        table, _ = build_view(real_table, self.sink_blocks,
                              torch.zeros_like(src_d), block_d.long(),
                              src_d.new_zeros((n, 0)), 1)
        passed = _width(viewed.block_table_tensor[src_d], table.shape[1])
        table = torch.where(windowed_d[:, None], table.to(passed.dtype), passed)
        seq_lens = torch.where(windowed_d, seq_d.to(viewed.seq_lens.dtype),
                               viewed.seq_lens[src_d])
        src_host = torch.from_numpy(sub.src)
        return viewed.replace(
            num_reqs=n,
            query_start_loc=qsl_d,
            query_start_loc_cpu=torch.from_numpy(qsl_new),
            seq_lens=seq_lens,
            max_query_len=int(sub.lens.max()),
            block_table_tensor=table,
            seq_lens_cpu_upper_bound=None,
            _seq_lens_cpu=None,
            _num_computed_tokens_cpu=None,
            _num_computed_tokens_cache=None,
            _token_to_req_indices_cache=None,
            is_prefilling=_rows(viewed.is_prefilling, src_host, src_d),
        )


_PER_ROW_UNCUT = ("dcp_local_seq_lens", "encoder_seq_lens", "mm_req_doc_ranges",
                  "rswa_prefix_lens")
"""Per-row fields of vLLM's metadata the split does not cut: a step with
any of them (decode context parallelism, cross-attention, multimodal
prefix ranges, reference sliding windows, whose buffers hold
``max_num_seqs`` rows) keeps its rows whole."""


@dataclass
class SubRows:
    """A first forward's sub-rows, [num_sub_rows] host arrays."""

    src: np.ndarray  # int64, the step's row each one belongs to
    lens: np.ndarray  # int64, its queries
    window_block: np.ndarray  # int64, first block of its window; -1: the row as viewed
    seq_lens: np.ndarray  # int64, tokens its view holds (windowed sub-rows)


@dataclass
class SplitView:
    """A step's view (or none) and the split of its first forward: what
    ``View`` is to every forward, with ``first`` for the one over prompts."""

    inner: View | None
    split: PromptSplit

    def rows(self, start: int, stop: int) -> SplitView:
        return SplitView(None if self.inner is None else self.inner.rows(start, stop),
                         self.split.rows(start, stop))

    def apply(self, cad):
        return cad if self.inner is None else self.inner.apply(cad)

    def first(self, cad):
        return self.split.apply(cad, self.apply(cad))


def _width(table: torch.Tensor, width: int) -> torch.Tensor:
    """``table`` [R, w] cut or zero-padded to ``width`` columns (padding that
    kernels never read: past every row's length)."""
    if table.shape[1] >= width:
        return table[:, :width]
    return torch.nn.functional.pad(table, (0, width - table.shape[1]))


def _rows(value, src_host: torch.Tensor, src_dev: torch.Tensor):
    """A per-row field of vLLM's metadata, one entry per sub-row."""
    if value is None:
        return None
    return value[src_dev if value.device == src_dev.device else src_host]
