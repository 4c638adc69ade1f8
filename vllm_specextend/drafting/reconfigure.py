"""A proposer's config-bound parts, built when the engine starts
(``_use_config``) and rebuilt between benchmark runs on one engine
(``reconfigure``).

The selection state is sized by ``top_k``, and the planner, retriever, view
builder and compactor read the config they were given, so a new config
replaces the state and hands every part the new config; selections made
under the old one are dropped, and so is the captured routine, which reads
the old state's buffers. A live engine refuses what its start fixed: the
scoring layer (its query capture is in the target's CUDA graphs), the
compaction scratch budget, and a prefill window it cannot serve.
"""

from __future__ import annotations

from vllm_specextend import compat
from vllm_specextend.config import (
    SpecExtendConfig,
    SpecExtendConfigError,
    raise_if_bad_pool_fill,
    raise_if_carry_unsupported,
    raise_if_lookup_unsupported,
    raise_if_prefill_window_unsupported,
    raise_if_prompt_pool_unsupported,
    resolve_lookup,
    resolve_pool_fill,
    resolve_prefill_window,
    resolve_prompt_pool,
    score_layer_index,
)
from vllm_specextend.drafting.carry import CarrySignal, carry_after
from vllm_specextend.drafting.draft_vocab import vocab_rows
from vllm_specextend.drafting.lookup import TokenHistory, lookup_min_match
from vllm_specextend.drafting.pool_fill import fill_in_graphs
from vllm_specextend.drafting.prompt_pool import PromptPools
from vllm_specextend.drafting.view import ViewBuilder
from vllm_specextend.retrieval.planner import StepPlanner
from vllm_specextend.retrieval.state import SelectionState


class Reconfigurable:
    """Goes behind ``SpecExtendMixin`` (its base): the parts that hold the
    config, over the mixin's ``retriever``, ``compactor``, ``capture`` and
    ``_min_context``."""

    def _use_config(self, cfg: SpecExtendConfig) -> None:
        if cfg.draft_prompt_pool == "auto":  # a benchmark's config (the
            # engine's own comes resolved: Settings.resolve)
            cfg, _ = resolve_prompt_pool(cfg, self.settings.facts)
        if cfg.draft_prefill_window == "auto":
            cfg, _ = resolve_prefill_window(cfg, self.settings.facts)
        if cfg.lookup_tokens == "auto":
            cfg, _ = resolve_lookup(cfg, self.settings.facts)
        if cfg.draft_pool_fill is not None:  # "auto" resolved and fitted to the
            # draft's graphs, as the engine's own (a no-op on it)
            cfg, _ = resolve_pool_fill(cfg, self.settings.facts)
        if cfg.carry_drafts is not None:  # once the lookup's count is known
            raise_if_carry_unsupported(cfg, self.settings.facts)
        # First, so that a draft_vocab the drafter cannot take changes nothing.
        self._vocab_rows = vocab_rows(self, cfg)
        self.cfg = cfg
        self.state = SelectionState(
            compat.max_num_seqs(self.vllm_config), cfg.top_k, self.device,
            live_req_ids=lambda: compat.live_req_ids(self.runner),
        )
        self.pools = None
        self._fill_in_graphs = fill_in_graphs()  # draft_pool_fill's forwards
        if cfg.draft_prompt_pool is not None:
            self.pools = PromptPools(self.state.num_slots, cfg.draft_prompt_pool,
                                     self._max_chunks(cfg), self.device)
        # Under async scheduling seq is optimistic by up to K accepted drafts.
        margin = self.speculative_config.num_speculative_tokens
        self.history = None  # lookup_tokens: each slot's tokens (lookup.py)
        if cfg.lookup_tokens:
            self.history = TokenHistory(self.state.num_slots, self.max_model_len,
                                        margin, self.device, lookup_min_match())
        self.carry_signal = None  # carry_drafts (carry.py)
        if cfg.lookup_tokens and cfg.carry_drafts is not None:
            self.carry_signal = CarrySignal(self.state.num_slots, self.device,
                                            carry_after())
        self.planner = StepPlanner(cfg, self.state, self._min_context, margin,
                                   self.pools)
        self.retriever.cfg, self.retriever.state = cfg, self.state
        self.retriever.pools = self.pools
        self._deferral_blocker = self._prefill_deferral_blocker(cfg)
        if self.compactor is not None:
            self.compactor.cfg = cfg
        self.view_builder: ViewBuilder | None = None
        # A proposer built without __init__ (unit tests) captures nothing.
        if getattr(self, "capture", None) is not None:
            self.capture.drop()

    def _max_chunks(self, cfg: SpecExtendConfig) -> int:
        """Chunk ids a row can reach at the engine's ``max_model_len``: a
        pool's width, the selection's widest step."""
        return self.max_model_len // cfg.chunk_size + 1

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
        raise_if_prompt_pool_unsupported(cfg, self.settings.facts)
        raise_if_bad_pool_fill(cfg, self.settings.facts)
        raise_if_lookup_unsupported(cfg, self.settings.facts)
        if self.compactor is not None:
            self.compactor.check_budget(cfg, self.block_size)
        self._run_kept_passes()
        self._use_config(cfg)

    def _resolved_score_layer(self, cfg: SpecExtendConfig) -> int:
        """``cfg.score_layer`` as 0..n-1 once the target's n layers are known."""
        count = self._num_score_layers
        return cfg.score_layer if count is None else score_layer_index(cfg, count)
