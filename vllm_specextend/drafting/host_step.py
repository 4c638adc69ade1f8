"""A draft step's host half: plan, retrieve, and which rows read through a
view; then the view, gathered on the device.

``propose`` runs it before vLLM's drafting: the planner decides from the
runner's host lengths (``planner.py``), the retriever scores the rows it
names (``retriever.py``), and the view builder picks the rows that read
through a selection (``ViewBuilder.params``); the result (``Step``) feeds
either the captured routine (``draft_capture.py``) or one gather of the
batch's view table (``_gather_view``) for vLLM's loop. No host-device sync:
the small arrays it produces reach the device in one non-blocking copy
(``staging``), and selections never leave the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_specextend import compat
from vllm_specextend.drafting.prompt_pool import PoolRows
from vllm_specextend.drafting.prompt_split import PromptSplit, SplitView, piece_tokens
from vllm_specextend.drafting.view import View, ViewBuilder, ViewParams
from vllm_specextend.retrieval.planner import BatchLens
from vllm_specextend.retrieval.retriever import FillRows


@dataclass
class Step:
    """A step's host plan: lengths, rows drafting, their slots, the view."""

    lens: BatchLens
    drafting: np.ndarray  # [num_reqs] bool
    slots: np.ndarray  # [num_reqs] int64
    slots_dev: torch.Tensor  # [num_reqs] int64
    params: ViewParams
    pool: PoolRows | None = None
    """Rows whose first draft forward is their prompt's pooled pass."""
    block_table: torch.Tensor | None = None
    """The step's real block table [num_reqs, max_blocks], for pooled views."""
    fill: FillRows | None = None
    """Rows whose pool grows before the step drafts (``draft_pool_fill``)."""


class HostStep:
    """Goes behind ``SpecExtendMixin`` (its base): the step over the
    proposer's ``planner``, ``retriever``, ``state``, ``staging`` and
    ``stats``. ``_drafting_rows`` comes from ``separate_draft.SeparateDraft`` or
    ``self_draft.TargetAsDraft``."""

    def _plan_view(self, cad, token_indices_to_sample, num_rejected) -> Step:
        """The host half of a step: plan, retrieve, and the view's rows."""
        num_reqs = cad.num_reqs
        req_ids = compat.batch_req_ids(self.runner, num_reqs)
        seq = compat.batch_seq_lens_cpu(self.runner, num_reqs).astype(np.int64)
        qsl = cad.query_start_loc_cpu[: num_reqs + 1].numpy()
        lens = BatchLens(
            seq=seq,
            num_prompt=np.asarray(
                compat.batch_num_prompt_tokens(self.runner, num_reqs), dtype=np.int64
            ),
            q_start=seq - np.diff(qsl),
        )
        builder = self._view_builder()
        self.staging.begin_step(self._staging_need(num_reqs))
        slots, slots_dev = self.state.slots_for(req_ids, self.staging)
        request = self.planner.plan(lens, slots)
        fill = None
        if request.rows.size:
            fill = self.retriever.retrieve(
                request, lens, slots, slots_dev, cad, token_indices_to_sample,
                num_rejected, self.stats,
            )
        drafting = self._drafting_rows(lens)
        pool = self._pool_rows(request, lens, slots)
        if pool is not None:
            drafting[pool.rows] = True  # through their selection, as decode rows
        params = builder.params(seq, drafting, slots, self.stats, lens.q_start)
        return Step(lens, drafting, slots, slots_dev, params, pool,
                    cad.block_table_tensor, fill)

    def _pool_rows(self, request, lens: BatchLens, slots) -> PoolRows | None:
        """The rows that end a pooled prompt this step (``draft_prompt_pool``)."""
        if request.pool is None or not request.pool.any():
            return None
        rows = request.rows[request.pool]
        (slots_d,) = self.staging.to_device(slots[rows])
        self.stats.pooled_prompt_passes += int(rows.size)
        return PoolRows(
            rows=rows,
            seq=lens.seq[rows],
            window_start=request.window_start[request.pool],
            chunks=self.pools.chunks[slots_d],
            sink_tokens=self.cfg.sink_tokens,
            chunk_size=self.cfg.chunk_size,
            q_start=lens.q_start[rows],
        )

    def _view_builder(self) -> ViewBuilder:
        if self.view_builder is None:
            # The kernel block size is known once vLLM initialized the backend.
            self.view_builder = ViewBuilder(
                self.cfg, self.state, self.staging, self.block_size, self.compactor
            )
        return self.view_builder

    def _gather_view(self, step: Step, cad) -> View | SplitView | None:
        view = None
        if step.params.on.any():
            view = self.view_builder.gather(
                step.params, step.slots, step.slots_dev, cad.block_table_tensor,
                self.stats,
            )
        split = self._prompt_split(step)
        return view if split is None else SplitView(view, split)

    def _prompt_split(self, step: Step) -> PromptSplit | None:
        """How the step's first forward cuts its long prompt rows
        (``draft_prefill_window``, ``prompt_split.py``); None: it does not."""
        if self.cfg.draft_prefill_window is None:
            return None
        lens = step.lens
        # A chunk that ends its prompt samples the first draft token from its
        # last query (``step.drafting`` holds the rows that read a view).
        return PromptSplit.for_step(
            lens.seq - lens.q_start, compat.attention_row_limit(self.vllm_config),
            q_start=lens.q_start, prompt=lens.q_start < lens.num_prompt,
            samples=lens.seq >= lens.num_prompt,
            window=self.cfg.draft_prefill_window,
            sink_blocks=self.view_builder.sink_blocks, block_size=self.block_size,
            piece=piece_tokens(), stats=self.stats)

    def _staging_need(self, num_reqs: int) -> int:
        # slots 1, retrieval 4, view 3, compaction 2 values per row, plus 4 per
        # copied block (at most sinks + top_k chunks per row).
        # A pooled prompt's step (``prompt_pool.py``): 2 more per pooled row,
        # 4 per row for each of its two pooled views at most.
        prefix = self.cfg.draft_budget_tokens // self.block_size
        # A pool's fill: 2 per row.
        pool = 12 if self.pools is not None else 0
        return num_reqs * (10 + pool + (4 * prefix if self.compactor else 0))
