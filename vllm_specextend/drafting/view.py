"""Block-table view: the draft's attention reads only the selected blocks.

vLLM caches keys after RoPE, so a view that lists a subset of a request's
physical blocks keeps every token at its original position; the attention
kernels only need a block table and a per-row length. Row r of the view is::

    [sink blocks] ++ [blocks of the selected chunks, in document order]
                  ++ [blocks from the window start to the end of the row]

and its length is ``seq_len - offset`` with ``offset = window_start -
num_prefix_blocks * block_size``: the window's tokens sit at the same distance
from the row's end as in the real table, so bottom-right causal masking stays
exact for every query, and all earlier (kept) blocks are fully visible.

With compacted positions (``rope.py``) the prefix columns list the row's
scratch blocks instead, holding copies whose keys sit at ``offset + view
index``: the whole row then spans contiguous positions ending at the real one.

KV writes never go through the view (slot mappings use the real table).
``ViewBuilder`` assembles a step's view from the selection state;
``View.apply`` gives the draft's attention metadata its table and lengths.
Pure torch and numpy; no vLLM import (``apply`` replaces fields of the
``CommonAttentionMetadata`` it is handed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch


def build_view(
    block_table: torch.Tensor,
    sink_blocks: int,
    num_selected: torch.Tensor,
    window_block: torch.Tensor,
    selected_chunks: torch.Tensor,
    blocks_per_chunk: int,
    width: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather a view of ``block_table`` ([R, B] int32, real table of kernel-block
    ids) through ``view_blocks``; returns the view [R, width] int32 (width: B by
    default) and the logical block index behind each column [R, width] int64."""
    idx = view_blocks(
        block_table.shape,
        sink_blocks,
        num_selected,
        window_block,
        selected_chunks,
        blocks_per_chunk,
        width,
    )
    return torch.gather(block_table, 1, idx), idx


def view_blocks(
    shape: torch.Size,
    sink_blocks: int,
    num_selected: torch.Tensor,
    window_block: torch.Tensor,
    selected_chunks: torch.Tensor,
    blocks_per_chunk: int,
    width: int | None = None,
) -> torch.Tensor:
    """Logical block index behind each column of the view, [R, width] int64.

    shape:           (R, B) of the real block table.
    num_selected:    [R] int, selected chunks per row (0: sinks + window only).
    window_block:    [R] int, first logical block of the recent window.
    selected_chunks: [R, K] int, chunk ids, the first ``num_selected`` valid.
    width:           view columns (default B). A fixed width below B (a CUDA
                     graph's) must cover every row's view length.
    Rows with ``num_selected == 0`` and ``window_block == sink_blocks`` map to
    themselves (the full table, or its first ``width`` blocks).
    Entries past the row's view length are padding that kernels never read.
    """
    num_rows, table_width = shape
    width = table_width if width is None else width
    j = torch.arange(width, device=num_selected.device)[None, :]
    prefix_end = sink_blocks + num_selected[:, None] * blocks_per_chunk
    in_selected = (j >= sink_blocks) & (j < prefix_end)
    rel = (j - sink_blocks).clamp(min=0)
    if selected_chunks.shape[1] > 0:
        slot = (rel // blocks_per_chunk).clamp(max=selected_chunks.shape[1] - 1)
        chunk = torch.gather(selected_chunks.long(), 1, slot.expand(num_rows, -1))
        selected_idx = chunk * blocks_per_chunk + rel % blocks_per_chunk
    else:
        selected_idx = j.expand(num_rows, -1)
    window_idx = j - prefix_end + window_block[:, None]
    chosen = torch.where(in_selected, selected_idx, window_idx)
    idx = torch.where(j < sink_blocks, j, chosen)
    return idx.clamp(0, table_width - 1).to(torch.int64)


def view_offsets(
    window_start: torch.Tensor | int,
    sink_blocks: int,
    num_selected: torch.Tensor | int,
    blocks_per_chunk: int,
    block_size: int,
) -> torch.Tensor | int:
    """Tokens dropped before the window: ``seq_len_view = seq_len - offset``
    (per row, as tensors or ints)."""
    prefix_tokens = (sink_blocks + num_selected * blocks_per_chunk) * block_size
    return window_start - prefix_tokens


def compacted_view(
    view_table: torch.Tensor, first_scratch: torch.Tensor, prefix_blocks: torch.Tensor
) -> torch.Tensor:
    """Swap each row's first ``prefix_blocks`` columns (sinks and selected
    chunks) for its run of scratch blocks starting at ``first_scratch`` (-1: the
    row keeps its real blocks). All [R] int on the table's device."""
    j = torch.arange(view_table.shape[1], device=view_table.device)[None, :]
    swap = (first_scratch[:, None] >= 0) & (j < prefix_blocks[:, None])
    swapped = torch.where(swap, first_scratch[:, None] + j, view_table)
    return swapped.to(view_table.dtype)


def prefix_shift(
    logical_blocks: torch.Tensor, offset: int, block_size: int
) -> torch.Tensor:
    """Position shift of each prefix block of one row under compaction.

    View column j holds logical block ``logical_blocks[j]`` (first token at
    ``logical_blocks[j] * block_size``); compacted, its first token sits at
    ``offset + j * block_size``, right before the window. Never negative: the
    prefix blocks are in document order and all before the window.
    """
    j = torch.arange(logical_blocks.shape[0], device=logical_blocks.device)
    return offset + (j - logical_blocks) * block_size


@dataclass
class View:
    """What the draft's attention metadata takes from a step's view."""

    block_table: torch.Tensor  # [num_reqs, width] int32
    offsets: torch.Tensor  # [num_reqs] int32, tokens dropped before the window
    offsets_cpu: torch.Tensor | None  # [num_reqs] int32, the same on the host
    max_seq_len: int | None = None
    """A fixed bound on every row's view length (a CUDA graph's, whose host
    values are baked in at capture); None: the metadata's own bound stands."""

    def rows(self, start: int, stop: int) -> View:
        """The view of rows ``start:stop`` only (a step cut in two)."""
        return View(self.block_table[start:stop], self.offsets[start:stop],
                    None if self.offsets_cpu is None else self.offsets_cpu[start:stop],
                    self.max_seq_len)

    def first(self, cad):
        """The first draft forward's metadata: as every forward's here
        (``prompt_split.SplitView`` cuts that forward's prompt rows)."""
        return self.apply(cad)

    def apply(self, cad):
        """vLLM's attention metadata ``cad`` read through this view: the view's
        table and each row's length less its offset, host shadows included.
        The slot mapping keeps the real table, so KV writes are unchanged."""
        if self.offsets_cpu is None:
            # A graph's view: host values are baked in at capture, so the
            # bound on every row's view length replaces the host shadows.
            return cad.replace(
                block_table_tensor=self.block_table,
                seq_lens=cad.seq_lens - self.offsets,
                max_seq_len=self.max_seq_len,
                seq_lens_cpu_upper_bound=None,
                _seq_lens_cpu=None,
                _num_computed_tokens_cpu=None,
                _num_computed_tokens_cache=None,
            )

        def minus(x):
            return None if x is None else x - self.offsets_cpu[: x.shape[0]]

        return cad.replace(
            block_table_tensor=self.block_table,
            seq_lens=cad.seq_lens - self.offsets,
            seq_lens_cpu_upper_bound=minus(cad.seq_lens_cpu_upper_bound),
            _seq_lens_cpu=minus(cad._seq_lens_cpu),
            _num_computed_tokens_cpu=minus(cad._num_computed_tokens_cpu),
            _num_computed_tokens_cache=None,
        )


@dataclass
class ViewParams:
    """The host half of a step's view, [num_reqs] each: which rows read
    through a selection, and where their prefix and window sit."""

    on: np.ndarray  # bool, the row reads through a view
    num_selected: np.ndarray  # int64, chunks kept (0 where off)
    window_block: np.ndarray  # int64, first logical block of the window
    offsets: np.ndarray  # int64, tokens dropped before the window (0 where off)
    prefix_blocks: np.ndarray  # int64, sink + selected blocks
    prefill: np.ndarray | None = None
    """bool, the ``on`` rows that are prompt chunks read through sinks and a
    window (``draft_prefill_window``), not a selection; None: none are."""

    @property
    def selecting(self) -> np.ndarray:
        """The ``on`` rows that read through their selection."""
        return self.on if self.prefill is None else self.on & ~self.prefill

    def view_lens(self, seq: np.ndarray) -> np.ndarray:
        """Tokens each row's view holds for a context of ``seq`` tokens."""
        return seq - self.offsets


class ViewBuilder:
    """A step's view from the selection state of the batch's rows.

    Rows without a selection in use map to themselves (sinks + window from the
    first block), so one gather serves the whole batch. Host lengths decide
    which rows read through a view (``params``); chunk ids stay on the device
    (``gather``).
    """

    def __init__(self, cfg, state, staging, block_size: int, compactor=None):
        self.cfg = cfg
        self.state = state
        self.staging = staging
        self.block_size = block_size
        self.compactor = compactor
        self.blocks_per_chunk = cfg.chunk_size // block_size
        self.sink_blocks = cfg.sink_tokens // block_size
        self._raise_if_chunk_not_whole_blocks()

    def _raise_if_chunk_not_whole_blocks(self) -> None:
        if self.cfg.chunk_size % self.block_size:
            raise ValueError(
                f"spec_extend.chunk_size={self.cfg.chunk_size} is not a multiple "
                f"of the draft's KV kernel block size {self.block_size}."
            )

    def build(self, seq, drafting, slots, slots_dev, block_table, stats,
              q_start=None) -> View | None:
        """seq, drafting (rows whose draft forwards may read through a view),
        slots: [num_reqs] host; block_table: [num_reqs, max_blocks] device."""
        params = self.params(seq, drafting, slots, stats, q_start)
        if not params.on.any():
            return None
        return self.gather(params, slots, slots_dev, block_table, stats)

    def params(self, seq, drafting, slots, stats, q_start=None) -> ViewParams:
        """The host half; counts the step's rows and context in ``stats``.
        ``q_start`` ([num_reqs], the first position each row computes this
        step) places the prompt-chunk rows' windows (``draft_prefill_window``)."""
        state, bs = self.state, self.block_size
        on = state.active[slots] & drafting  # [num_reqs]
        num_selected = np.where(on, state.num_selected[slots], 0)
        prefix = self.sink_blocks + num_selected * self.blocks_per_chunk
        starts = state.window_start[slots]
        window_block = np.where(on, starts // bs, self.sink_blocks)
        offsets = np.where(on, starts - prefix * bs, 0)
        stats.decode_rows += int(drafting.sum())
        stats.full_context_tokens += int(seq[drafting].sum())
        stats.draft_context_tokens += int((seq - offsets)[drafting].sum())
        if on.any():
            state.steps_since_refresh[slots[on]] += 1
            stats.view_rows += int(on.sum())
        prefill = self._prefill_windows(drafting, q_start)
        if prefill is not None:
            # Sinks, then whole blocks from the window's start to the row's
            # end: the chunk's queries are the row's last tokens, so
            # bottom-right causal masking stays exact.
            first = (q_start - self.cfg.draft_prefill_window) // bs
            on = on | prefill
            window_block = np.where(prefill, first, window_block)
            offsets = np.where(prefill, (first - self.sink_blocks) * bs, offsets)
            stats.prefill_window_rows += int(prefill.sum())
        return ViewParams(on, num_selected, window_block, offsets, prefix, prefill)

    def _prefill_windows(self, drafting, q_start) -> np.ndarray | None:
        """Prompt-chunk rows whose window drops blocks past the sinks; None
        where no row does (or the window is off)."""
        window = self.cfg.draft_prefill_window
        if window is None or q_start is None:
            return None
        prefill = ~drafting & ((q_start - window) // self.block_size > self.sink_blocks)
        return prefill if prefill.any() else None

    def pooled_pass(self, params: ViewParams, pool, slots_dev, block_table) -> View:
        """The view of a step's first draft forward where rows end a pooled
        prompt (``prompt_pool.PoolRows``): those rows read their sinks, their
        pool's chunks and their window, the blocks their pooled pass writes;
        every other row as in ``gather``. No compaction (``draft_prompt_pool``
        excludes it)."""
        rows, n = pool.rows, pool.chunks.shape[1]
        num_selected = params.num_selected.copy()
        num_selected[rows] = n
        offsets = params.offsets.copy()
        prefix = (self.sink_blocks + n * self.blocks_per_chunk) * self.block_size
        offsets[rows] = pool.window_start - prefix
        (rows_d,) = self.staging.to_device(rows)
        chunks = self.state.selected_chunks[slots_dev]  # [num_reqs, top_k]
        if n > chunks.shape[1]:
            chunks = torch.nn.functional.pad(chunks, (0, n - chunks.shape[1]))
        chunks = chunks.index_copy(0, rows_d, pool.chunks.to(chunks.dtype))
        params = dataclasses.replace(params, num_selected=num_selected, offsets=offsets)
        return self.gather(params, None, slots_dev, block_table, None, chunks)

    def gather(self, params: ViewParams, slots, slots_dev, block_table, stats,
               chunks: torch.Tensor | None = None) -> View:
        """The device half: one gather of the real table for the whole batch.
        ``chunks`` [num_reqs, >= top_k]: each row's chunk ids, in place of its
        selection (a pooled pass's view, ``pooled_pass``; no compaction)."""
        num_selected_d, window_block_d, offsets_d = self.staging.to_device(
            params.num_selected, params.window_block, params.offsets
        )
        table, logical = build_view(
            block_table,
            self.sink_blocks,
            num_selected_d,
            window_block_d,
            self.state.selected_chunks[slots_dev] if chunks is None else chunks,
            self.blocks_per_chunk,
        )
        if self.compactor is not None:
            table = self.compactor.apply(
                table, logical, params.selecting, slots, params.prefix_blocks,
                params.offsets, self.state, self.staging, self.block_size, stats,
            )
        return View(
            table,
            offsets_d.to(torch.int32),
            torch.from_numpy(params.offsets.astype(np.int32)),
        )
