"""The whole draft routine as one CUDA graph per batch size.

Why: vLLM 0.26's V1 drafter replays only PIECEWISE graphs. Every draft layer's
attention and KV write run eagerly between graph pieces, and the attention
metadata is rebuilt on the host before each of the K draft forwards, so at
batch 1 a 16-layer draft keeps the GPU waiting for the host a quarter to a
third of the time (``../shared/docs/draft-graphs.md``). The view bounds what
the draft reads: every row's view fits ``width_tokens``, so one graph can
replay the whole routine (vLLM's own first pass, its K-1 decode steps, slot
mappings, sampling and the view gather) over new contents at fixed addresses.

``DraftGraphs`` is the capture manager beside the proposer, as vLLM's V2
speculators keep theirs: persistent input buffers (``DraftInputs``), one graph
per batch size and draft count (``carry_drafts`` steps draft fewer tokens:
``carry.py``), and the choice per step (``blocker``) between replaying and
the eager path. The body it captures is the proposer's (``draft_capture.py``):
vLLM's ``propose`` over the static buffers, with runtime mode NONE inside the
capture so the draft's own piecewise graphs are not nested. Each step the
runner's small input tensors are copied into the static buffers (one copy
each), the graph replays, and the drafts are cloned out, as the eager path
returns fresh tensors.

``mode="static"`` runs the same body on the same buffers without capturing:
the CPU tests use it to hold the graph path token-identical to the eager one.
Pure torch; no vLLM.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

import numpy as np
import torch

MAX_GRAPH_BATCH = 32
"""Largest batch captured. Past it the draft's GPU work per forward outgrows
its host work, so a graph saves little (speed-path.md, section 1)."""


def graph_view_tokens(working_set: int, min_view_context: int, retrieve_every: int,
                      num_spec_tokens: int, block_size: int) -> int:
    """The view length every captured row must fit (tokens, whole blocks).

    A row with a selection spans at most ``working_set`` tokens until its
    next refresh; a row without one is shorter than ``min_view_context`` when
    its last refresh was planned and has grown since by at most
    ``retrieve_every + 1`` steps of K+1 tokens. The step's own first pass and
    drafts add up to 2K+2 more. The per-step check (``blocker``) is what
    holds; this only sizes the graph generously.
    """
    k = num_spec_tokens
    need = (max(working_set, min_view_context) + (retrieve_every + 1) * (k + 1)
            + 2 * k + 2)
    return -(-need // block_size) * block_size


def uniform_decode(*, batch: int, k: int, num_tokens: int, max_query_len: int,
                   all_decoding: bool) -> bool:
    """Every row decodes and verifies K drafts: K + 1 tokens a row."""
    return all_decoding and num_tokens == batch * (k + 1) and max_query_len == k + 1


def blocker(*, batch: int, num_spec_tokens: int, graph_k: int, captured: set[int],
            num_tokens: int, max_query_len: int, all_decoding: bool,
            longest_view: int, width_tokens: int, greedy: bool,
            table_width: int, graph_table_width: int) -> str | None:
    """Why this step cannot replay a graph (a short reason), or None.

    ``longest_view``: the longest row's view after this step's drafts, from
    host lengths (an upper bound under async scheduling).
    """
    if batch not in captured:
        return "batch size not captured"
    if num_spec_tokens != graph_k:
        return "K differs from the captured K"
    if not uniform_decode(batch=batch, k=graph_k, num_tokens=num_tokens,
                          max_query_len=max_query_len, all_decoding=all_decoding):
        return "not a uniform decode batch"
    if longest_view > width_tokens:
        return "a row's view outgrows the graph's width"
    if not greedy:
        return "probabilistic draft sampling"
    if table_width != graph_table_width:
        return "block table width changed"
    return None


class DraftInputs:
    """Persistent buffers a captured draft routine reads; the runner's tensors
    are copied in before each replay. Sized for ``max_batch`` rows of ``k + 1``
    verified tokens. ``hidden_width``: an EAGLE head's input features per
    token (0: a draft model, which reads token ids alone)."""

    def __init__(self, max_batch: int, k: int, table_width: int,
                 device: torch.device, hidden_width: int = 0,
                 hidden_dtype: torch.dtype = torch.bfloat16):
        n = max_batch * (k + 1)
        self.k = k
        self.max_batch = max_batch
        self.table_width = table_width
        self.token_ids = torch.zeros(n, dtype=torch.int32, device=device)  # [n]
        self.positions = torch.zeros(n, dtype=torch.int64, device=device)  # [n]
        self.slot_mapping = torch.zeros(n, dtype=torch.int64, device=device)  # [n]
        self.next_token_ids = torch.zeros(max_batch, dtype=torch.int32,
                                          device=device)  # [b]
        self.num_rejected = torch.zeros(max_batch, dtype=torch.int32,
                                        device=device)  # [b]
        # Uniform decode: every row verifies k + 1 tokens. [b + 1]
        qsl = np.arange(max_batch + 1, dtype=np.int32) * (k + 1)
        self.query_start_loc_cpu = torch.from_numpy(qsl)
        self.query_start_loc = self.query_start_loc_cpu.to(device)
        # A short context: the capture's eager warm-up writes KV into block 0
        # (vLLM's null block) through the all-zero table.
        self.seq_lens = torch.full((max_batch,), k + 1, dtype=torch.int32,
                                   device=device)  # [b]
        self.block_table = torch.zeros(max_batch, table_width, dtype=torch.int32,
                                       device=device)  # [b, max_blocks]
        # Per row: selected chunks, window block, offset, selection slot. [4, b]
        self.view_params = torch.zeros(4, max_batch, dtype=torch.int64,
                                       device=device)
        # EAGLE: the target's hidden states and the index of each row's last
        # verified token. [n, hidden_width], [b]
        self.hidden = (torch.zeros(n, hidden_width, dtype=hidden_dtype,
                                   device=device) if hidden_width else None)
        self.sample_indices = torch.zeros(max_batch, dtype=torch.int32,
                                          device=device)

    def load(self, batch: int, token_ids: torch.Tensor, positions: torch.Tensor,
             next_token_ids: torch.Tensor, num_rejected: torch.Tensor,
             seq_lens: torch.Tensor, block_table: torch.Tensor,
             view_params: torch.Tensor, hidden: torch.Tensor | None = None,
             sample_indices: torch.Tensor | None = None,
             slot_mapping: torch.Tensor | None = None) -> None:
        """Copy one step's inputs in; ``view_params`` [4, batch]; an EAGLE
        head's ``hidden``, ``sample_indices`` and the verified tokens'
        ``slot_mapping`` (its KV sits at the target's slots). Stream-ordered
        device copies, no sync."""
        n = batch * (self.k + 1)
        self.token_ids[:n].copy_(token_ids)
        self.positions[:n].copy_(positions)
        self.next_token_ids[:batch].copy_(next_token_ids)
        self.num_rejected[:batch].copy_(num_rejected)
        self.seq_lens[:batch].copy_(seq_lens)
        self.block_table[:batch].copy_(block_table)
        self.view_params[:, :batch].copy_(view_params)
        if self.hidden is not None:
            self.hidden[:n].copy_(hidden)
            self.sample_indices[:batch].copy_(sample_indices)
            self.slot_mapping[:n].copy_(slot_mapping[:n])


CaptureContext = Callable[[], AbstractContextManager[torch.cuda.Stream]]
"""Opens the context a capture runs in, yielding the stream to capture on."""


@contextmanager
def _side_stream() -> Iterator[torch.cuda.Stream]:
    yield torch.cuda.Stream()


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph | None
    output: torch.Tensor  # [batch, k] int64, overwritten by every replay


class DraftGraphs:
    """One captured draft routine per batch size and draft count.

    ``body(batch, drafts)`` runs the routine over the static inputs, drafting
    ``drafts`` tokens through the draft model (one of ``draft_counts``), and
    returns the step's proposals ([batch, k]); it is called once eagerly per
    size and count (compiling and autotuning what the shapes need), then
    under capture. ``capture=False`` (``mode="static"``, or no CUDA) keeps
    the sizes but runs the body eagerly on every step instead of replaying.
    """

    def __init__(self, body: Callable[[int, int], torch.Tensor], sizes: list[int],
                 inputs: DraftInputs, width_tokens: int, capture: bool,
                 capture_context: CaptureContext | None = None,
                 draft_counts: tuple[int, ...] | None = None):
        self.body = body
        self.sizes = sorted(set(sizes), reverse=True)
        # The usual count first; K (no lookup) by default.
        self.draft_counts = draft_counts or (inputs.k,)
        self.inputs = inputs
        self.width_tokens = width_tokens
        self.capture_graphs = capture
        # Yields the stream to capture on; with tensor parallelism vLLM's
        # (``compat.capture_stream``), which records the draft's collectives.
        self.capture_context = capture_context or _side_stream
        self._graphs: dict[tuple[int, int], _Captured] = {}  # (batch, drafts)
        self._pool = None

    @property
    def captured(self) -> set[int]:
        """Batch sizes captured (each for every draft count)."""
        return {batch for batch, _ in self._graphs}

    def _routines(self) -> list[tuple[int, int]]:
        return [(b, d) for b in self.sizes for d in self.draft_counts]

    def capture(self) -> None:
        """Largest batch first, all in one private memory pool: the smaller
        graphs reuse the larger ones' intermediate memory, and nothing is
        shared with vLLM's own graphs."""
        if not self.capture_graphs:
            self._graphs = {key: _Captured(None, torch.empty(0))
                            for key in self._routines()}
            return
        self._pool = torch.cuda.graph_pool_handle()
        gc.collect()
        # Warm-ups first, outside the capture context: Triton compiles, FA3
        # plans these shapes, and collectives run as in an eager step (inside
        # vLLM's context the custom all-reduce only allocates when not
        # capturing).
        for batch, drafts in self._routines():
            self.body(batch, drafts)
        torch.cuda.synchronize()
        # Capture needs a stream other than the default one; replays run on
        # the step's stream.
        with self.capture_context() as stream:
            for batch, drafts in self._routines():
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, stream=stream):
                    output = self.body(batch, drafts)
                self._graphs[batch, drafts] = _Captured(graph, output)
            torch.cuda.synchronize()

    def run(self, batch: int, drafts: int | None = None) -> torch.Tensor:
        """The proposals for the inputs loaded for ``batch`` rows, ``drafts``
        of them drafted (the usual count by default), [batch, k]."""
        drafts = self.draft_counts[0] if drafts is None else drafts
        captured = self._graphs[batch, drafts]
        if captured.graph is None:
            return self.body(batch, drafts)
        captured.graph.replay()
        return captured.output.clone()

    def release(self) -> None:
        self._graphs.clear()
        self._pool = None
