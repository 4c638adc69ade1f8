"""vLLM's draft_model and EAGLE proposers with Cross-model Retrieval: the adapter.

``SpecExtendMixin`` goes in front of a ``SpecDecodeBaseProposer`` subclass:
``SpecExtendProposer`` (``DraftModelProposer``, method ``draft_model``),
``SpecExtendEagleProposer`` (``EagleProposer``, ``eagle``/``eagle3``) and
``SelfDraftProposer`` (the target drafting for itself, ``self_draft.py``). All
draft through the base class's loop and metadata funnel, so the view and
compaction apply to an EAGLE head's KV as to a draft model's.

This module only adapts vLLM's hooks; the work is done by:

* ``planner.StepPlanner``: which rows drop, score or keep their selection;
* ``retriever.Retriever``: scoring-layer query capture, scoring, top-k chunks;
* ``view.ViewBuilder``: the block-table view of the batch's rows;
* ``compactor.Compactor``: scratch copies for compacted positions;
* ``state.SelectionState``: per-request selections in persistent buffers;
* ``deferral.PrefillDeferral``: draft passes over prompt chunks kept for later.

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

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from typing_extensions import override

from vllm_specextend import compat
from vllm_specextend.compactor import Compactor
from vllm_specextend.config import (
    SpecExtendConfig,
    SpecExtendConfigError,
    raise_if_prefill_window_unsupported,
    score_layer_index,
)
from vllm_specextend.deferral import PrefillDeferral
from vllm_specextend.draft_graph import (
    MAX_GRAPH_BATCH,
    DraftGraphs,
    DraftInputs,
    blocker,
    graph_view_tokens,
)
from vllm_specextend.metrics import SpecExtendStats, StatsReporter
from vllm_specextend.planner import BatchLens, StepPlanner
from vllm_specextend.retriever import Retriever
from vllm_specextend.self_draft import TargetAsDraft
from vllm_specextend.settings import Settings
from vllm_specextend.staging import HostStaging
from vllm_specextend.state import SelectionState
from vllm_specextend.view import View, ViewBuilder, ViewParams, view_blocks

logger = compat.logger


class SpecExtendMixin:
    _graphable = False
    """The draft routine can be captured (``capture_graphs``): a separate
    draft's (a draft model, an EAGLE head); a target drafting for itself
    replays the target's own graphs."""
    _defers_prefill = False
    """Passes over prompt chunks can wait for a later step (``deferral.py``):
    a draft model's, whose first pass needs nothing of the target but the
    tokens. An EAGLE head reads the target's hidden states of the chunk."""

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
        self._tuning = DraftTuning.from_env(device)
        if runner is not None and self._tuning.early_output_copy \
                and getattr(runner, "use_async_scheduling", False):
            compat.copy_outputs_after_sampling(runner)
        self._view: View | None = None
        self.graphs: DraftGraphs | None = None
        self._in_graph = False  # the body runs: no nested piecewise graphs
        self._graph_blockers: set[str] = set()
        self.retriever = Retriever(self.cfg, None, self.staging, device)
        self._num_score_layers: int | None = None  # the target's, once loaded
        self.deferral = PrefillDeferral()
        self._engine_deferral_blocker = compat.prefill_deferral_blocker(vllm_config)
        self._use_config(self.cfg)

    def _use_config(self, cfg: SpecExtendConfig) -> None:
        # First, so that a draft_vocab the drafter cannot take changes nothing.
        self._vocab_rows = self._cut_vocab(cfg)
        self.cfg = cfg
        self.state = SelectionState(
            compat.max_num_seqs(self.vllm_config), cfg.top_k, self.device,
            live_req_ids=lambda: compat.live_req_ids(self.runner),
        )
        # Under async scheduling seq is optimistic by up to K accepted drafts.
        margin = self.speculative_config.num_speculative_tokens
        self.planner = StepPlanner(cfg, self.state, self._min_context, margin)
        self.retriever.cfg, self.retriever.state = cfg, self.state
        self._deferral_blocker = self._prefill_deferral_blocker(cfg)
        if self.compactor is not None:
            self.compactor.cfg = cfg
        self.view_builder: ViewBuilder | None = None
        if getattr(self, "graphs", None) is not None:
            # The graphs read the old selection buffers: drafting goes on
            # eagerly (reconfigure is for benchmarks and evaluations).
            self.graphs.release()
            self.graphs = None
            logger.info("SpecExtend: reconfigured; draft graphs dropped.")

    @override
    def load_model(self, target_model) -> None:
        # super() loads the draft and learns which attention layers are its own.
        super().load_model(target_model)
        self._vocab_rows = self._cut_vocab(self.cfg)
        _, self._num_score_layers, layer = compat.target_attention(
            self.vllm_config, self._scoring_excludes(), self.cfg
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
            if self.cfg.defer_prefill_draft and self._deferral_blocker:
                logger.info("SpecExtend: draft passes over prompt chunks run in "
                            "their own step (%s).", self._deferral_blocker)

    def _prefill_deferral_blocker(self, cfg: SpecExtendConfig) -> str | None:
        if not cfg.defer_prefill_draft:
            return "defer_prefill_draft is false"
        if not self._defers_prefill:
            return "an EAGLE head or self_draft drafts from the target's step"
        # A proposer built without __init__ (unit tests) has no engine to defer in.
        return getattr(self, "_engine_deferral_blocker", "no engine")

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
        if self._resolved_score_layer(cfg) != self._resolved_score_layer(self.cfg):
            raise SpecExtendConfigError(
                "spec_extend.score_layer is fixed when the engine starts (the "
                "query capture is recorded in the target's CUDA graphs); start "
                "an engine per score_layer."
            )
        raise_if_prefill_window_unsupported(cfg, self.settings.facts)
        if self.compactor is not None:
            self.compactor.check_budget(cfg, self.block_size)
        self._run_kept_passes()
        self._use_config(cfg)

    def _resolved_score_layer(self, cfg: SpecExtendConfig) -> int:
        """``cfg.score_layer`` as 0..n-1 once the target's n layers are known."""
        count = self._num_score_layers
        return cfg.score_layer if count is None else score_layer_index(cfg, count)

    def on_requests_done(self, req_ids) -> None:
        """Finished, aborted or preempted: their selection is stale, and
        passes kept for them run now, before their blocks are handed out."""
        if self.deferral.holds_any(req_ids):
            self._run_kept_passes()
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
        # Extends super(): plans the view (and retrieves) on the host, then
        # replays the captured draft routine when the step fits it, else sets
        # the view for the funnel and drafts as vLLM does.
        # K = 0 (vLLM's per-batch-size schedule turned drafting off) samples no
        # draft, so no view is needed. A step of prompt chunks that sample
        # nothing keeps its pass for later (deferral.py); any other step runs
        # the kept passes first.
        cad = common_attn_metadata
        keep = self._keeps_pass(mm_embed_inputs, num_rejected_tokens_gpu)
        if not keep:
            self._run_kept_passes()
        try:
            step = None
            if self.cfg.policy != "full" and num_speculative_tokens > 0:
                # Kept steps are planned too: the planner counts steps.
                step = self._plan_view(cad, token_indices_to_sample,
                                       num_rejected_tokens_gpu)
            if keep:
                # Prompt chunks' windows (draft_prefill_window) go with the pass.
                view = None if step is None else self._gather_view(step, cad)
                return self._keep_pass(cad, target_token_ids, target_positions,
                                       next_token_ids, num_speculative_tokens, view)
            if step is not None:
                drafts = self._maybe_replay(
                    step, num_speculative_tokens, target_token_ids,
                    target_positions, target_hidden_states, next_token_ids,
                    token_indices_to_sample, cad, sampling_metadata,
                    mm_embed_inputs, num_rejected_tokens_gpu,
                )
                if drafts is not None:
                    return drafts
                self._view = self._gather_view(step, cad)
            return super().propose(
                num_speculative_tokens,
                target_token_ids,
                target_positions,
                target_hidden_states,
                next_token_ids,
                token_indices_to_sample,
                cad,
                sampling_metadata,
                mm_embed_inputs=mm_embed_inputs,
                num_rejected_tokens_gpu=num_rejected_tokens_gpu,
                slot_mappings=slot_mappings,
            )
        finally:
            self._view = None
            self._report()

    # --- draft passes over prompt chunks, kept for later (deferral.py) ----------

    def _keeps_pass(self, mm_embed_inputs, num_rejected) -> bool:
        return (self._deferral_blocker is None and self.runner is not None
                and mm_embed_inputs is None and num_rejected is None
                and compat.samples_no_row(self.runner))

    def _keep_pass(self, cad, token_ids, positions, next_token_ids,
                   num_speculative_tokens, view=None) -> torch.Tensor:
        # The runner discards every row's drafts this step: zeros, as vLLM's
        # own when the drafter cannot run. [num_reqs, K]
        self.deferral.keep(compat.batch_req_ids(self.runner, cad.num_reqs),
                           token_ids, positions, next_token_ids, cad, view)
        # The runner reads the drafter's draft probabilities after propose;
        # vLLM's propose clears them first, so must a step that skips it.
        self._last_draft_probs = None
        return torch.zeros((cad.num_reqs, num_speculative_tokens),
                           dtype=torch.int64, device=self.device)

    @torch.inference_mode()
    def _run_kept_passes(self) -> None:
        """The kept passes, oldest first, each as vLLM's propose with K = 0:
        its first pass only, the one that writes the chunk's draft KV. In
        inference mode as vLLM's own step: they may run from the worker,
        before the runner's step (``on_requests_done``, block copies)."""
        if not len(self.deferral):
            return
        k = getattr(self, "num_speculative_tokens", None)
        passes = self.deferral.take()
        try:
            while passes:
                kept = passes[0]
                self._view = kept.view  # the funnel reads through it
                self._base_propose(
                    0, kept.token_ids, kept.positions, None, kept.next_token_ids,
                    None, kept.common_attn_metadata, _GREEDY,
                )
                passes.pop(0)
                self.stats.deferred_prefill_passes += 1
        finally:
            self._view = None
            # A pass that raised stays kept, with those after it.
            self.deferral.passes[:0] = passes
            # vLLM's propose keeps the K it was last called with.
            if k is not None:
                self.num_speculative_tokens = k

    def before_block_copies(self) -> None:
        """vLLM is about to copy whole KV blocks (the draft's too) at the
        start of a step: the kept passes write theirs first."""
        self._run_kept_passes()

    @override
    def build_per_group_and_layer_attn_metadata(
        self, common_attn_metadata, draft_index: int = 0
    ):
        # The funnel of every draft forward: read through the view, then super().
        if self._view is not None:
            common_attn_metadata = self._apply_view(common_attn_metadata, self._view)
        per_group, per_layer = super().build_per_group_and_layer_attn_metadata(
            common_attn_metadata, draft_index
        )
        if self._in_graph and self._tuning.aot_schedule:
            # Recorded once per forward; a split count of its own would not
            # match the schedule, so the two switches exclude each other.
            compat.schedule_draft_attention(self, per_group,
                                            common_attn_metadata.num_reqs)
        if self._tuning.attn_splits is not None:
            for metadata in per_group:
                compat.set_attn_splits(metadata, self._tuning.attn_splits)
        return per_group, per_layer

    def _cut_vocab(self, cfg: SpecExtendConfig) -> torch.Tensor | None:
        """``[draft_vocab, hidden]``: the drafter's ``lm_head`` rows greedy
        drafts choose from (``cfg.draft_vocab``); None for the whole
        vocabulary, or before the drafter is loaded."""
        model = getattr(self, "model", None)
        if cfg.draft_vocab is None or model is None:
            return None
        if self.use_local_argmax_reduction or self.use_heterogeneous_vocab:
            raise SpecExtendConfigError(
                "spec_extend.draft_vocab cannot cut a drafter whose vocabulary "
                "vLLM maps or reduces per rank (a draft with another tokenizer, "
                "or local argmax reduction); leave draft_vocab unset."
            )
        return compat.lm_head_rows(model, cfg.draft_vocab)

    @override
    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # The greedy draft token: vLLM's argmax, or the Triton one (a tuning
        # switch under measurement, ``DraftTuning``).
        argmax = self._tuning.argmax
        if self._vocab_rows is not None:
            # Logits of the first draft_vocab ids only: [num_tokens, draft_vocab],
            # whose indices are those token ids.
            logits = torch.nn.functional.linear(hidden_states, self._vocab_rows)
            return argmax(logits) if argmax is not None else logits.argmax(dim=-1)
        if (argmax is not None and not self.use_local_argmax_reduction
                and not self.use_heterogeneous_vocab):
            return argmax(self.model.compute_logits(hidden_states))
        return super()._greedy_sample(hidden_states)

    @override
    def _determine_batch_execution_and_padding(self, num_tokens: int,
                                               use_cudagraphs: bool = True):
        # Inside the captured body the draft's own piecewise graphs must not
        # replay (graphs do not nest): run its compiled pieces directly.
        if self._in_graph:
            return compat.CUDAGraphMode.NONE, num_tokens, None
        return super()._determine_batch_execution_and_padding(
            num_tokens, use_cudagraphs=use_cudagraphs
        )

    def _apply_view(self, cad, view: View):
        if view.offsets_cpu is None:
            # A graph's view: host values are baked in at capture, so the
            # bound on every row's view length replaces the host shadows.
            return cad.replace(
                block_table_tensor=view.block_table,
                seq_lens=cad.seq_lens - view.offsets,
                max_seq_len=view.max_seq_len,
                seq_lens_cpu_upper_bound=None,
                _seq_lens_cpu=None,
                _num_computed_tokens_cpu=None,
                _num_computed_tokens_cache=None,
            )

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

    def _plan_view(self, cad, token_indices_to_sample, num_rejected) -> _Step:
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
        return _Step(lens, drafting, slots, slots_dev, params)

    def _view_builder(self) -> ViewBuilder:
        if self.view_builder is None:
            # The kernel block size is known once vLLM initialized the backend.
            self.view_builder = ViewBuilder(
                self.cfg, self.state, self.staging, self.block_size, self.compactor
            )
        return self.view_builder

    def _gather_view(self, step: _Step, cad) -> View | None:
        if not step.params.on.any():
            return None
        return self.view_builder.gather(
            step.params, step.slots, step.slots_dev, cad.block_table_tensor,
            self.stats,
        )

    # --- the captured draft routine (draft_graph.py) ------------------------------

    def _maybe_replay(self, step: _Step, num_speculative_tokens, target_token_ids,
                      target_positions, target_hidden_states, next_token_ids,
                      token_indices_to_sample, cad, sampling_metadata,
                      mm_embed_inputs, num_rejected) -> torch.Tensor | None:
        """The drafts from the captured routine, or None where this step
        cannot replay it (it then drafts eagerly; ``graph_fallbacks`` counts)."""
        graphs = self.graphs
        if graphs is None:
            return None
        batch = cad.num_reqs
        view_lens = step.params.view_lens(step.lens.seq)
        reason = blocker(
            batch=batch,
            num_spec_tokens=num_speculative_tokens,
            graph_k=graphs.inputs.k,
            captured=graphs.captured,
            num_tokens=cad.num_actual_tokens,
            max_query_len=cad.max_query_len,
            all_decoding=bool(step.drafting.all()),
            longest_view=int(view_lens.max()) + num_speculative_tokens + 2,
            width_tokens=graphs.width_tokens,
            greedy=self._greedy_drafts(sampling_metadata)
            and mm_embed_inputs is None,
            table_width=cad.block_table_tensor.shape[1],
            graph_table_width=graphs.inputs.table_width,
        )
        if reason is not None:
            self.stats.graph_fallbacks += 1
            if reason not in self._graph_blockers:
                self._graph_blockers.add(reason)
                # Once per reason: the count is in graph_fallbacks and the
                # periodic line ("draft graph: replayed/all steps").
                logger.info("SpecExtend: some draft steps run eagerly: %s "
                            "(first seen now; counted in graph_fallbacks).", reason)
            return None
        params = step.params
        (view_params,) = self.staging.to_device(np.stack([
            params.num_selected, params.window_block, params.offsets, step.slots,
        ]))
        graphs.inputs.load(
            batch, target_token_ids, target_positions, next_token_ids,
            num_rejected, cad.seq_lens, cad.block_table_tensor,
            view_params.view(4, batch), target_hidden_states,
            token_indices_to_sample, cad.slot_mapping,
        )
        self.stats.graph_steps += 1
        return graphs.run(batch)

    def _greedy_drafts(self, sampling_metadata) -> bool:
        # vLLM samples drafts only with probabilistic draft sampling and a
        # non-greedy batch; a graph would bake one batch's sampling in.
        return (not self._enable_probabilistic_draft_probs
                or sampling_metadata.all_greedy)

    def capture_graphs(self) -> None:
        """After vLLM's own capture (the worker's warm-up): capture the draft
        routine per batch size, or say in one line why drafting stays eager.
        ``draft_graph``: ``auto`` captures on CUDA, ``static`` runs the same
        routine uncaptured (tests, debugging), ``off`` keeps vLLM's path."""
        mode = self.cfg.draft_graph
        capture = mode == "auto"
        if mode == "off" or (capture and self.device.type != "cuda"):
            return
        reason = self._graphs_unsupported(capture)
        if reason is not None:
            logger.info("SpecExtend: draft routine not captured (%s); drafting "
                        "through vLLM's piecewise graphs.", reason)
            return
        k = self.speculative_config.num_speculative_tokens
        table_width = compat.block_table_width(self.runner, self.kv_cache_gid)
        width = min(
            graph_view_tokens(self.cfg.working_set_tokens(k), self._min_context,
                              self.cfg.retrieve_every, k, self.block_size),
            table_width * self.block_size,
        )
        max_batch = min(compat.max_num_seqs(self.vllm_config), MAX_GRAPH_BATCH)
        hidden_width = (compat.eagle_input_width(self)
                        if self.pass_hidden_states_to_model else 0)
        inputs = DraftInputs(max_batch, k, table_width, self.device,
                             hidden_width, self.dtype)
        graphs = DraftGraphs(
            lambda batch: self._graph_body(batch, inputs, width),
            list(range(1, max_batch + 1)), inputs, width, capture,
            capture_context=lambda: compat.capture_stream(self.device),
        )
        self._view_builder()
        try:
            graphs.capture()
        except Exception as e:  # noqa: BLE001 - any failure: stay on vLLM's path
            graphs.release()
            logger.warning("SpecExtend: capturing the draft routine failed (%s: "
                           "%s); drafting through vLLM's piecewise graphs.",
                           type(e).__name__, e)
            return
        self.graphs = graphs
        logger.info(
            "SpecExtend: draft routine %s for batch sizes 1-%d (K=%d, view "
            "width %d tokens).", "captured" if capture else "on static buffers",
            max_batch, k, width,
        )

    def _graphs_unsupported(self, capture: bool) -> str | None:
        if not self._graphable:
            return "self_draft drafts through the target's own graphs"
        if self.cfg.policy == "full":
            return "policy full has no bounded view"
        if self.compactor is not None:
            return "compacted positions"
        return compat.draft_graph_blocker(self.vllm_config, self.draft_attn_groups,
                                          capture)

    def _graph_body(self, batch: int, inputs: DraftInputs,
                    width_tokens: int) -> torch.Tensor:
        """vLLM's propose over the static inputs and a view gathered from them;
        what ``DraftGraphs`` captures. [batch, k] drafts."""
        k, n = inputs.k, batch * (inputs.k + 1)
        builder = self.view_builder
        num_selected, window_block, offsets, slots = inputs.view_params[:, :batch]
        logical = view_blocks(
            (batch, inputs.table_width), builder.sink_blocks, num_selected,
            window_block, self.state.selected_chunks[slots],
            builder.blocks_per_chunk, width=width_tokens // self.block_size,
        )
        table = inputs.block_table[:batch]
        cad = compat.decode_attn_metadata(
            query_start_loc=inputs.query_start_loc[: batch + 1],
            query_start_loc_cpu=inputs.query_start_loc_cpu[: batch + 1],
            seq_lens=inputs.seq_lens[:batch],
            num_reqs=batch,
            num_actual_tokens=n,
            max_query_len=k + 1,
            max_seq_len=width_tokens,
            block_table_tensor=table,
            slot_mapping=inputs.slot_mapping[:n],
        )
        self._view = View(torch.gather(table, 1, logical),
                          offsets.to(torch.int32), None, width_tokens)
        # An EAGLE head reads the target's hidden states and writes its KV at
        # the verified tokens' slots; a draft model needs neither.
        eagle = inputs.hidden is not None
        self._in_graph = True
        try:
            return self._base_propose(
                k, inputs.token_ids[:n], inputs.positions[:n],
                inputs.hidden[:n] if eagle else None,
                inputs.next_token_ids[:batch],
                inputs.sample_indices[:batch] if eagle else None, cad, _GREEDY,
                num_rejected_tokens_gpu=inputs.num_rejected[:batch],
            )
        finally:
            self._in_graph = False
            self._view = None

    def _base_propose(self, *args, **kwargs) -> torch.Tensor:
        """vLLM's propose, past this mixin's."""
        return super().propose(*args, **kwargs)

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
            self.stats.request_slots = self.state.num_slots_held
            self.reporter.maybe_report(force=True)


def _env_choice(name: str, default: str, other: str) -> str:
    """``name``'s value in the environment, ``default`` where unset or empty;
    anything but the two values is refused by name."""
    value = os.environ.get(name) or default
    if value not in (default, other):
        raise ValueError(f"{name}={value!r}: use {default!r} (the default) or {other!r}")
    return value


@dataclass(frozen=True)
class DraftTuning:
    """Switches for the draft's kernels on a GPU, read from the environment of
    the engine's workers (``docs/design.md``, "Switches"). Defaults, each from
    a same-session A/B on an H100 (64K, batch 1: 188-189 tok/s without both,
    190-191 with both, ``benchmarks/results/decode/20261125T22*``):

    - ``SPECEXTEND_DRAFT_ARGMAX``: ``triton`` (default; the greedy draft token
      by ``argmax_triton``, equal to ``torch.argmax`` index for index) or
      ``torch`` (vLLM's).
    - ``SPECEXTEND_DRAFT_AOT``: ``1`` (default; FA3's ahead-of-time split
      schedule for the captured routine's forwards: one scheduling kernel per
      forward instead of one per layer pass) or ``0``.
    - ``SPECEXTEND_DRAFT_ATTN_SPLITS=N``: the draft's FlashAttention split
      count (unset: vLLM's, up to 32 under CUDA graphs). The AOT schedule
      plans vLLM's bound, so a count of its own turns AOT off.
    - ``SPECEXTEND_EARLY_OUTPUT_COPY``: ``1`` (default) lets the runner's
      async output copy wait for sampling only, not for the drafter queued
      after it (``compat.patches.EARLY_OUTPUT_COPY``; issue #22's time to
      first token, with ``deferral.py``); ``0`` for vLLM's copy.
    """

    argmax: Callable[[torch.Tensor], torch.Tensor] | None = None
    attn_splits: int | None = None
    aot_schedule: bool = False
    early_output_copy: bool = False

    @classmethod
    def from_env(cls, device: torch.device) -> DraftTuning:
        if device.type != "cuda":
            return cls()
        argmax_name = _env_choice("SPECEXTEND_DRAFT_ARGMAX", "triton", "torch")
        aot = _env_choice("SPECEXTEND_DRAFT_AOT", "1", "0")
        early = _env_choice("SPECEXTEND_EARLY_OUTPUT_COPY", "1", "0")
        splits = os.environ.get("SPECEXTEND_DRAFT_ATTN_SPLITS") or None
        if splits is not None and not (splits.isdigit() and int(splits) > 0):
            raise ValueError(f"SPECEXTEND_DRAFT_ATTN_SPLITS={splits!r}: use a positive "
                             "integer, or leave it unset for vLLM's split count")
        argmax = None
        if argmax_name == "triton":
            from vllm_specextend.argmax_triton import argmax_triton as argmax
        return cls(argmax=argmax, attn_splits=int(splits) if splits else None,
                   aot_schedule=aot == "1" and splits is None,
                   early_output_copy=early == "1")


@dataclass
class _Step:
    """A step's host plan: lengths, rows drafting, their slots, the view."""

    lens: BatchLens
    drafting: np.ndarray  # [num_reqs] bool
    slots: np.ndarray  # [num_reqs] int64
    slots_dev: torch.Tensor  # [num_reqs] int64
    params: ViewParams


_GREEDY = SimpleNamespace(all_greedy=True)
"""Sampling metadata of a captured routine: vLLM reads only ``all_greedy``
from it when drafts are sampled greedily (``_greedy_drafts``)."""


class SeparateDraft:
    """The drafter has weights and KV of its own (a draft model, an EAGLE
    head); the SpecExtend mixin's hooks for it. ``self_draft.TargetAsDraft``
    is the other kind."""

    def _scoring_excludes(self) -> set[str]:
        """Attention layers that are not the target's: the draft's own."""
        return self._draft_attn_layer_names

    def _drafting_rows(self, lens: BatchLens) -> np.ndarray:
        """Rows whose draft forwards may read through their selection: those
        past prefill. A row that finishes its prompt this step drafts over it
        in full, as the draft's own KV of the prompt is written by this pass
        (with ``draft_prefill_window``: through the chunk's window, as every
        prompt chunk, ``ViewBuilder.params``)."""
        return lens.decoding


class SpecExtendProposer(SpecExtendMixin, SeparateDraft, compat.DraftModelProposer):
    """``draft_model`` with Cross-model Retrieval."""

    _graphable = True
    _defers_prefill = True


class SpecExtendEagleProposer(SpecExtendMixin, SeparateDraft, compat.EagleProposer):
    """``eagle`` / ``eagle3`` with Cross-model Retrieval."""

    _graphable = True


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
