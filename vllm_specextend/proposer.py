"""vLLM's draft_model and EAGLE proposers with Cross-model Retrieval: the adapter.

``SpecExtendMixin`` goes in front of a ``SpecDecodeBaseProposer`` subclass:
``SpecExtendProposer`` (``DraftModelProposer``, method ``draft_model``),
``SpecExtendEagleProposer`` (``EagleProposer``, ``eagle``/``eagle3``) and
``SelfDraftProposer`` (the target drafting for itself, ``self_draft.py``). All
draft through the base class's loop and metadata funnel, so the view and
compaction apply to an EAGLE head's KV as to a draft model's.

This module only adapts vLLM's hooks (``propose``, ``load_model``, the
metadata funnel, ``_greedy_sample``, the graph mode); the work is done by:

* ``host_step.HostStep``: a step's host half (plan, retrieve, the view's rows)
  over ``planner.StepPlanner``, ``retriever.Retriever``, ``view.ViewBuilder``
  and ``state.SelectionState``;
* ``draft_capture.DraftCapture``: the captured draft routine (``draft_graph``);
* ``kept_passes.KeptPasses``: prompt passes kept for later (``deferral``);
* ``pooled_passes.PooledPasses``: steps that end a pooled prompt (``prompt_pool``);
* ``lookup_step.LookupStep``: each step's tokens into the history, the step's
  draft count, the lookup after the drafts (``lookup``, ``carry``);
* ``worker_hooks.WorkerHooks``: what the plugin's worker calls (scratch,
  warm-up, capture, finished requests, the counters' report);
* ``separate_draft.SeparateDraft`` / ``self_draft.TargetAsDraft``: a draft
  of its own, or the target drafting for itself;
* ``reconfigure.Reconfigurable``: the parts that hold the config;
* ``compactor.Compactor``: scratch copies for compacted positions;
* ``draft_vocab``, ``tuning.DraftTuning``: the greedy token's vocabulary cut,
  the kernel switches.

Each step, before vLLM's own drafting runs (``super().propose``), the host
step plans and retrieves, then the step either replays the captured routine
or gathers a view for every row with a selection. Every draft forward takes
its attention metadata through ``build_per_group_and_layer_attn_metadata``;
while a view is active that funnel swaps in the view's block table and
shortened ``seq_lens`` (``View.apply``). Slot mappings, and so all KV writes,
still use the real table, so the draft's KV stays complete and prefix
caching, preemption and later full-context steps remain exact.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from typing_extensions import override

from vllm_specextend import compat
from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.drafting.compactor import Compactor
from vllm_specextend.drafting.deferral import PrefillDeferral
from vllm_specextend.drafting.draft_capture import DraftCapture
from vllm_specextend.drafting.draft_vocab import vocab_rows
from vllm_specextend.drafting.host_step import HostStep
from vllm_specextend.drafting.kept_passes import KeptPasses
from vllm_specextend.drafting.lookup_step import LookupStep
from vllm_specextend.drafting.pooled_passes import PooledPasses
from vllm_specextend.drafting.prompt_pool import FirstPassPositions
from vllm_specextend.drafting.reconfigure import Reconfigurable
from vllm_specextend.drafting.replicated import ReplicatedDraft
from vllm_specextend.drafting.self_draft import TargetAsDraft
from vllm_specextend.drafting.separate_draft import SeparateDraft
from vllm_specextend.drafting.tuning import DraftTuning
from vllm_specextend.drafting.view import View
from vllm_specextend.drafting.worker_hooks import WorkerHooks
from vllm_specextend.retrieval.retriever import Retriever
from vllm_specextend.retrieval.staging import HostStaging
from vllm_specextend.serving.metrics import StatsReporter
from vllm_specextend.serving.settings import Settings
from vllm_specextend.serving.stats import SpecExtendStats

logger = compat.logger


class SpecExtendMixin(Reconfigurable, HostStep, KeptPasses, PooledPasses, LookupStep,
                      WorkerHooks):
    _graphable = False
    """The draft routine can be captured (``capture_graphs``): a separate
    draft's (a draft model, an EAGLE head); a target drafting for itself
    replays the target's own graphs."""

    def __init__(self, vllm_config, device: torch.device, runner=None):
        super().__init__(vllm_config, device, runner=runner)
        # The base class accepts the runner but does not keep it.
        self.runner = runner
        self.settings = Settings.from_vllm(vllm_config)
        self.cfg = self.settings.config
        self.stats = SpecExtendStats()
        self.reporter: StatsReporter | None = None
        self.staging = HostStaging(device, stats=self.stats)
        self.compactor: Compactor | None = None
        if self.settings.compaction_on:
            self.compactor = Compactor(
                self.cfg, vllm_config, device, self.settings.draft_len
            )
            compat.allow_long_drafts(runner)
        self._min_context = self.settings.min_view_context
        self._tuning = DraftTuning.from_env(device)
        if device.type == "cuda":  # before vLLM's spec-decode kernels first run
            compat.compile_once_per_step_shape()
        if runner is not None and self._tuning.early_output_copy \
                and getattr(runner, "use_async_scheduling", False):
            compat.copy_outputs_after_sampling(runner)
        self._view: View | None = None
        self._first_view: View | None = None
        self._first_pass: FirstPassPositions | None = None
        self.capture = DraftCapture(self)
        self.retriever = Retriever(self.cfg, None, self.staging, device)
        self._num_score_layers: int | None = None  # the target's, once loaded
        self.deferral = PrefillDeferral()
        self._engine_deferral_blocker = compat.prefill_deferral_blocker(vllm_config)
        self._use_config(self.cfg)

    @override
    def load_model(self, target_model) -> None:
        # super() loads the draft and learns which attention layers are its own.
        super().load_model(target_model)
        self._vocab_rows = vocab_rows(self, self.cfg)
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
        # Extends super(): plans the view (and retrieves) on the host, fills pools,
        # then replays the captured draft routine or drafts as vLLM does through
        # the view (K = 0: no view). Prompt chunks that sample nothing keep their
        # pass for later, or are cut off their step (kept_passes.py).
        cad = common_attn_metadata
        drop = self._drops_pass(cad, mm_embed_inputs)
        keep = drop or self._keeps_pass(mm_embed_inputs, num_rejected_tokens_gpu)
        cut = None if keep else self._split_point(
            cad, mm_embed_inputs, sampling_metadata, num_speculative_tokens)
        if self._runs_kept_first(keep, cut, cad.num_reqs):
            self._run_kept_passes()
        try:
            step = None
            if self.cfg.policy != "full" and num_speculative_tokens > 0:
                # Kept steps are planned too: the planner counts steps.
                step = self._plan_view(cad, token_indices_to_sample,
                                       num_rejected_tokens_gpu)
            self._record_tokens(step, cad, target_token_ids, target_positions,
                                next_token_ids, num_rejected_tokens_gpu)
            self._fill_pools(step, cad)  # draft KV for the pools' new chunks
            pooled = step is not None and step.pool is not None
            self._plan_carry(step, cad, num_speculative_tokens, num_rejected_tokens_gpu,
                             drafts_now=not (keep or pooled or cut is not None))
            if keep:
                # Prompt chunks' windows (draft_prefill_window) go with the pass.
                view = None if step is None else self._gather_view(step, cad)
                return self._keep_pass(cad, target_token_ids, target_positions,
                                       next_token_ids, num_speculative_tokens, view,
                                       drop)
            if cut is not None:
                view = None if step is None else self._gather_view(step, cad)
                return self._propose_split(
                    cut, view, num_speculative_tokens, target_token_ids,
                    target_positions, next_token_ids, token_indices_to_sample, cad,
                    num_rejected_tokens_gpu, step if pooled else None)
            if pooled and self._drafts_as_decode(step, cad, num_speculative_tokens,
                                                 mm_embed_inputs):
                # Rows end a pooled prompt, any others decode: the passes run
                # first, then the step drafts as a decode step (replayable).
                (target_token_ids, target_positions, token_indices_to_sample, cad,
                 num_rejected_tokens_gpu) = self._pass_then_tails(
                    step, num_speculative_tokens, target_token_ids, target_positions,
                    token_indices_to_sample, cad, next_token_ids,
                    num_rejected_tokens_gpu)
                pooled = False
            if pooled:
                # Rows end a pooled prompt: their first forward is its pass.
                (target_token_ids, target_positions, token_indices_to_sample, cad,
                 self._first_view) = self._pooled_inputs(
                    step, 0, target_token_ids, target_positions,
                    token_indices_to_sample, cad, next_token_ids)
                self._view = self._gather_view(step, cad)
            elif step is not None:
                drafts = self.capture.replay(
                    step, num_speculative_tokens, target_token_ids,
                    target_positions, target_hidden_states, next_token_ids,
                    token_indices_to_sample, cad, sampling_metadata,
                    mm_embed_inputs, num_rejected_tokens_gpu,
                )
                if drafts is not None:
                    return drafts
                self._view = self._gather_view(step, cad)
            return self._vllm_propose(
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
            self._view = self._first_view = self._first_pass = None
            self._lookup_rows, self._carrying = None, False
            self._report()

    @override
    def build_per_group_and_layer_attn_metadata(
        self, common_attn_metadata, draft_index: int = 0
    ):
        # The funnel of every draft forward: read through the view, then super().
        # The first forward: a pooled prompt's pass reads its own view, and a
        # view's ``first`` cuts long prompt rows (``prompt_split.py``).
        view = self._view
        if draft_index == 0 and self._first_view is not None:
            view = self._first_view
        if view is not None:
            common_attn_metadata = (view.first if draft_index == 0 else view.apply)(
                common_attn_metadata)
        per_group, per_layer = super().build_per_group_and_layer_attn_metadata(
            common_attn_metadata, draft_index
        )
        if self.capture.in_body and self._tuning.aot_schedule:
            # Recorded once per forward; a split count of its own would not
            # match the schedule, so the two switches exclude each other.
            compat.schedule_draft_attention(self, per_group,
                                            common_attn_metadata.num_reqs)
        if self._tuning.attn_splits is not None:
            for metadata in per_group:
                compat.set_attn_splits(metadata, self._tuning.attn_splits)
        return per_group, per_layer

    @override
    def set_inputs_first_pass(self, *args, **kwargs):
        # vLLM numbers each row's first-forward tokens on from the row's first
        # one; a pooled pass's rows are not contiguous: their own positions
        # and slots go in after (``prompt_pool.FirstPassPositions``).
        num_tokens, token_indices_to_sample, cad = super().set_inputs_first_pass(
            *args, **kwargs)
        first_pass, self._first_pass = self._first_pass, None
        if first_pass is not None:
            first_pass.apply(self.positions, cad, self.block_size)
        return num_tokens, token_indices_to_sample, cad

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
        if self.capture.in_body:
            return compat.CUDAGraphMode.NONE, num_tokens, None
        return super()._determine_batch_execution_and_padding(
            num_tokens, use_cudagraphs=use_cudagraphs
        )

    def _greedy_propose(self, num_speculative_tokens, token_ids, positions,
                        hidden_states, next_token_ids, token_indices_to_sample,
                        cad, num_rejected_tokens_gpu=None) -> torch.Tensor:
        """vLLM's propose, past this mixin's, drafting greedily: what the
        plugin runs itself (kept passes, the captured routine's body)."""
        return self._vllm_propose(
            num_speculative_tokens, token_ids, positions, hidden_states,
            next_token_ids, token_indices_to_sample, cad, _GREEDY,
            num_rejected_tokens_gpu=num_rejected_tokens_gpu,
        )

    def _vllm_propose(self, num_speculative_tokens, *args, **kwargs) -> torch.Tensor:
        """vLLM's propose: K - lookup_tokens drafts, then the lookup's. [B, K]"""
        drafts = super().propose(self._drafted(num_speculative_tokens), *args, **kwargs)
        return self._looked_up(drafts, num_speculative_tokens)


_GREEDY = SimpleNamespace(all_greedy=True)
"""Sampling metadata of a propose the plugin runs itself: vLLM reads only
``all_greedy`` from it when drafts are sampled greedily (the captured routine
replays only then: ``KeptPasses._drafts_greedily``)."""


class SpecExtendProposer(ReplicatedDraft, SpecExtendMixin, SeparateDraft,
                         compat.DraftModelProposer):
    """``draft_model`` with Cross-model Retrieval; sharded or replicated at TP
    (``replicated.py``)."""

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
