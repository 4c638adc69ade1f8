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
from vllm_specextend.planner import BatchLens
from vllm_specextend.view import View, ViewBuilder, ViewParams


@dataclass
class Step:
    """A step's host plan: lengths, rows drafting, their slots, the view."""

    lens: BatchLens
    drafting: np.ndarray  # [num_reqs] bool
    slots: np.ndarray  # [num_reqs] int64
    slots_dev: torch.Tensor  # [num_reqs] int64
    params: ViewParams


class HostStep:
    """Goes behind ``SpecExtendMixin`` (its base): the step over the
    proposer's ``planner``, ``retriever``, ``state``, ``staging`` and
    ``stats``. ``_drafting_rows`` comes from ``proposer.SeparateDraft`` or
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
        if request.rows.size:
            self.retriever.retrieve(
                request, lens, slots, slots_dev, cad, token_indices_to_sample,
                num_rejected, self.stats,
            )
        drafting = self._drafting_rows(lens)
        params = builder.params(seq, drafting, slots, self.stats, lens.q_start)
        return Step(lens, drafting, slots, slots_dev, params)

    def _view_builder(self) -> ViewBuilder:
        if self.view_builder is None:
            # The kernel block size is known once vLLM initialized the backend.
            self.view_builder = ViewBuilder(
                self.cfg, self.state, self.staging, self.block_size, self.compactor
            )
        return self.view_builder

    def _gather_view(self, step: Step, cad) -> View | None:
        if not step.params.on.any():
            return None
        return self.view_builder.gather(
            step.params, step.slots, step.slots_dev, cad.block_table_tensor,
            self.stats,
        )

    def _staging_need(self, num_reqs: int) -> int:
        # slots 1, retrieval 4, view 3, compaction 2 values per row, plus 4 per
        # copied block (at most sinks + top_k chunks per row).
        prefix = self.cfg.draft_budget_tokens // self.block_size
        return num_reqs * (10 + (4 * prefix if self.compactor else 0))
