"""vLLM's draft_model and EAGLE proposers with Cross-model Retrieval: the adapter.

``SpecExtendMixin`` goes in front of a ``SpecDecodeBaseProposer`` subclass:
``SpecExtendProposer`` (``DraftModelProposer``, method ``draft_model``),
``SpecExtendEagleProposer`` (``EagleProposer``, ``eagle``/``eagle3``) and
``SelfDraftProposer`` (the target drafting for itself, ``self_draft.py``). All
draft through the base class's loop and metadata funnel, so the view and
compaction apply to an EAGLE head's KV as to a draft model's.

This module only adapts vLLM's hooks; the work is done by:

* ``planner.StepPlanner``: which rows drop, score or keep their selection;
* ``retriever.Retriever``: final-layer query capture, scoring, top-k chunks;
* ``view.ViewBuilder``: the block-table view of the batch's rows;
* ``compactor.Compactor``: scratch copies for compacted positions;
* ``state.SelectionState``: per-request selections in persistent buffers.

Each step, before vLLM's own drafting runs (``super().propose``), the planner
decides from host lengths, the retriever scores the rows it names, and the view
builder gathers a view for every row with a selection. Every draft forward
takes its attention metadata through ``build_per_group_and_layer_attn_metadata``;
while a view is active that funnel swaps in the view's block table and
shortened ``seq_lens``. Slot mappings, and so all KV writes, still use the real
table, so the draft's KV stays complete and prefix caching, preemption and
later full-context steps remain exact.

No host-device sync in the plugin's step: decisions use host lengths, the
small arrays they produce reach the device in one non-blocking copy
(``staging``), and selections never leave the device.
"""

from __future__ import annotations

import numpy as np
import torch
from typing_extensions import override

from vllm_specextend import compat
from vllm_specextend.compactor import Compactor
from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.metrics import SpecExtendStats, StatsReporter
from vllm_specextend.planner import BatchLens, StepPlanner
from vllm_specextend.retriever import Retriever
from vllm_specextend.self_draft import TargetAsDraft
from vllm_specextend.settings import Settings
from vllm_specextend.staging import HostStaging
from vllm_specextend.state import SelectionState
from vllm_specextend.view import View, ViewBuilder

logger = compat.logger


class SpecExtendMixin:
    def __init__(self, vllm_config, device: torch.device, runner=None):
        super().__init__(vllm_config, device, runner=runner)
        # The base class accepts the runner but does not keep it.
        self.runner = runner
        self.settings = Settings.from_vllm(vllm_config)
        self.cfg = self.settings.config
        self.stats = SpecExtendStats()
        self.reporter: StatsReporter | None = None
        self.staging = HostStaging(device)
        self.compactor: Compactor | None = None
        if self.settings.compaction_on:
            self.compactor = Compactor(
                self.cfg, vllm_config, device, self.settings.draft_len
            )
            compat.allow_long_drafts(runner)
        self._min_context = self.settings.min_view_context
        self._view: View | None = None
        self.retriever = Retriever(self.cfg, None, self.staging, device)
        self._use_config(self.cfg)

    def _use_config(self, cfg: SpecExtendConfig) -> None:
        self.cfg = cfg
        self.state = SelectionState(
            compat.max_num_seqs(self.vllm_config), cfg.top_k, self.device,
            live_req_ids=lambda: compat.live_req_ids(self.runner),
        )
        # Under async scheduling seq is optimistic by up to K accepted drafts.
        margin = self.speculative_config.num_speculative_tokens
        self.planner = StepPlanner(cfg, self.state, self._min_context, margin)
        self.retriever.cfg, self.retriever.state = cfg, self.state
        if self.compactor is not None:
            self.compactor.cfg = cfg
        self.view_builder: ViewBuilder | None = None

    @override
    def load_model(self, target_model) -> None:
        # super() loads the draft and learns which attention layers are its own.
        super().load_model(target_model)
        _, layer = compat.last_target_attention(
            self.vllm_config, exclude=self._scoring_excludes()
        )
        tp_rank, tp_size = compat.tp_rank_and_size()
        self.retriever.attach(
            layer, compat.max_num_batched_tokens(self.vllm_config), self.dtype, tp_size
        )
        if self.compactor is not None:
            self.compactor.extend_rope(self.model, self.max_model_len)
        # TP ranks count the same rows: only the first one publishes.
        self.reporter = StatsReporter(
            self.stats,
            compat.log_stats_interval(),
            logger.info,
            publish=tp_rank == 0,
            engine=self.settings.engine_index,
            warn=logger.warning,
        )
        if tp_rank == 0:
            logger.info("SpecExtend enabled: %s", self.cfg)

    def scratch_bytes(self) -> int:
        """Draft KV bytes of the compaction scratch; 0 without compaction."""
        if self.compactor is None:
            return 0
        return self.compactor.scratch_bytes(self._draft_attn_layer_names)

    def add_scratch_blocks(self) -> None:
        """After the KV cache exists: scratch blocks for compacted positions."""
        if self.compactor is not None:
            self.compactor.add_blocks(
                self.runner, self._draft_attn_layer_names, self.block_size
            )

    def reconfigure(self, cfg: SpecExtendConfig) -> None:
        """Benchmarks only: switch policy or parameters between runs on one
        engine; selections made under the old config are dropped."""
        if self.compactor is not None:
            self.compactor.check_budget(cfg, self.block_size)
        self._use_config(cfg)

    def on_requests_done(self, req_ids) -> None:
        """Finished, aborted or preempted: their selection is stale."""
        self.state.release(req_ids)
        # Once the batch empties no draft step follows: publish now, or /metrics
        # would miss the last requests' counts until the next request.
        self._report(force=compat.live_req_ids(self.runner) <= set(req_ids))

    @override
    def propose(
        self,
        num_speculative_tokens,
        target_token_ids,
        target_positions,
        target_hidden_states,
        next_token_ids,
        token_indices_to_sample,
        common_attn_metadata,
        sampling_metadata,
        mm_embed_inputs=None,
        num_rejected_tokens_gpu=None,
        slot_mappings=None,
    ) -> torch.Tensor:
        # Extends super(): sets the view for the funnel, then drafts as usual.
        # K = 0 (vLLM's per-batch-size schedule turned drafting off) samples no
        # draft, so no view is needed.
        if self.cfg.policy != "full" and num_speculative_tokens > 0:
            self._view = self._prepare_view(
                common_attn_metadata, token_indices_to_sample, num_rejected_tokens_gpu
            )
        try:
            return super().propose(
                num_speculative_tokens,
                target_token_ids,
                target_positions,
                target_hidden_states,
                next_token_ids,
                token_indices_to_sample,
                common_attn_metadata,
                sampling_metadata,
                mm_embed_inputs=mm_embed_inputs,
                num_rejected_tokens_gpu=num_rejected_tokens_gpu,
                slot_mappings=slot_mappings,
            )
        finally:
            self._view = None
            self._report()

    @override
    def build_per_group_and_layer_attn_metadata(
        self, common_attn_metadata, draft_index: int = 0
    ):
        # The funnel of every draft forward: read through the view, then super().
        if self._view is not None:
            common_attn_metadata = self._apply_view(common_attn_metadata)
        return super().build_per_group_and_layer_attn_metadata(
            common_attn_metadata, draft_index
        )

    def _apply_view(self, cad):
        view = self._view

        def minus(x):
            return None if x is None else x - view.offsets_cpu[: x.shape[0]]

        return cad.replace(
            block_table_tensor=view.block_table,
            seq_lens=cad.seq_lens - view.offsets,
            seq_lens_cpu_upper_bound=minus(cad.seq_lens_cpu_upper_bound),
            _seq_lens_cpu=minus(cad._seq_lens_cpu),
            _num_computed_tokens_cpu=minus(cad._num_computed_tokens_cpu),
            _num_computed_tokens_cache=None,
        )

    def _prepare_view(self, cad, token_indices_to_sample, num_rejected) -> View | None:
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
        if self.view_builder is None:
            # The kernel block size is known once vLLM initialized the backend.
            self.view_builder = ViewBuilder(
                self.cfg, self.state, self.staging, self.block_size, self.compactor
            )
        self.staging.begin_step(self._staging_need(num_reqs))
        slots, slots_dev = self.state.slots_for(req_ids, self.staging)
        request = self.planner.plan(lens, slots)
        if request.rows.size:
            self.retriever.retrieve(
                request, lens, slots, slots_dev, cad, token_indices_to_sample,
                num_rejected, self.stats,
            )
        return self.view_builder.build(
            seq, self._drafting_rows(lens), slots, slots_dev, cad.block_table_tensor,
            self.stats,
        )

    def _staging_need(self, num_reqs: int) -> int:
        # slots 1, retrieval 4, view 3, compaction 2 values per row, plus 4 per
        # copied block (at most sinks + top_k chunks per row).
        prefix = self.cfg.draft_budget_tokens // self.block_size
        return num_reqs * (10 + (4 * prefix if self.compactor else 0))

    def _report(self, force: bool = False) -> None:
        # The sweep is a backstop, not a per-step cost: run it when reporting.
        if self.reporter is not None and (force or self.reporter.due()):
            self.state.sweep(compat.live_req_ids(self.runner))
            self.stats.tracked_requests = len(self.state)
            self.reporter.maybe_report(force=True)


class SeparateDraft:
    """The drafter has weights and KV of its own (a draft model, an EAGLE
    head); the SpecExtend mixin's hooks for it. ``self_draft.TargetAsDraft``
    is the other kind."""

    def _scoring_excludes(self) -> set[str]:
        """Attention layers that are not the target's: the draft's own."""
        return self._draft_attn_layer_names

    def _drafting_rows(self, lens: BatchLens) -> np.ndarray:
        """Rows whose draft forwards may read through a view: those past
        prefill. A row that finishes its prompt this step drafts over it in
        full, as the draft's own KV of the prompt is written by this pass."""
        return lens.decoding


class SpecExtendProposer(SpecExtendMixin, SeparateDraft, compat.DraftModelProposer):
    """``draft_model`` with Cross-model Retrieval."""


class SpecExtendEagleProposer(SpecExtendMixin, SeparateDraft, compat.EagleProposer):
    """``eagle`` / ``eagle3`` with Cross-model Retrieval."""


class SelfDraftProposer(SpecExtendMixin, TargetAsDraft, compat.DraftModelProposer):
    """The target drafting for itself through the view of its own KV."""


def proposer_class(cfg: SpecExtendConfig, method: str) -> type:
    """The proposer for a resolved engine (``config.validate_engine`` has
    checked the method)."""
    if cfg.self_draft:
        return SelfDraftProposer
    if method == "draft_model":
        return SpecExtendProposer
    return SpecExtendEagleProposer
