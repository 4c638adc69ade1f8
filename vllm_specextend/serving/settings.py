"""SpecExtend's settings for one engine, resolved and validated once.

:class:`Settings` joins the parsed ``spec_extend`` config, the facts of the
resolved vLLM engine it depends on, and the decisions drawn from both
(compaction on or off, the context length from which rows draft through a
view). ``Settings.from_vllm(vllm_config)`` is what the engine-config hook, the
worker and the proposer use: it parses and validates once per ``VllmConfig``
object and returns the same ``Settings`` to later callers in the process.
(The API server and each worker process hold their own copy of the config,
so each resolves it once.)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from vllm_specextend import compat
from vllm_specextend.config import (
    ADDITIONAL_CONFIG_KEY,
    EngineFacts,
    SpecExtendConfig,
    compaction_on,
    raise_if_carry_unsupported,
    replicated_draft,
    resolve_lookup,
    resolve_prefill_window,
    resolve_pool_fill,
    resolve_prompt_pool,
    validate_engine,
)


def enabled(vllm_config) -> bool:
    """Whether this engine asked for SpecExtend (``--spec-extend`` or
    ``additional_config["spec_extend"]``)."""
    return ADDITIONAL_CONFIG_KEY in compat.additional_config(vllm_config)


@dataclass(frozen=True)
class Settings:
    config: SpecExtendConfig
    facts: EngineFacts
    compaction_on: bool
    """Sinks and chunks are re-rotated to positions the draft has
    (``compact_positions``, ``auto`` resolved)."""
    draft_len: int | None
    """The draft's max_model_len while compacting, else None (no limit)."""
    min_view_context: int
    """Context length from which a row drafts through a view."""
    replicated_draft: bool = False
    """Every TP rank holds the whole draft (``draft_placement``, resolved)."""
    engine_index: int = 0
    """This engine's ``engine`` label on /metrics (its data-parallel rank)."""
    prompt_pool_note: str | None = None
    """What ``draft_prompt_pool: "auto"`` became here and why (None where the
    config named it), for the start-up log."""
    prefill_window_note: str | None = None
    """What ``draft_prefill_window: "auto"`` became here and why (None where
    the config named a window or null), for the start-up log."""
    lookup_note: str | None = None
    """What ``lookup_tokens: "auto"`` became here and why (None where the
    config named a count), for the start-up log."""
    pool_fill_note: str | None = None
    """What ``draft_pool_fill`` became here: ``"auto"``'s chunks a refresh, a
    fill lowered to fit the draft's CUDA graphs, or a named fill dropped where
    no pool is made (None where a named fill runs as named), for the
    start-up log."""

    @classmethod
    def resolve(
        cls, config: SpecExtendConfig, facts: EngineFacts, engine_index: int = 0
    ) -> Settings:
        """Validate ``config`` against ``facts`` and draw the decisions;
        ``config`` holds what ``"auto"`` keys resolved to."""
        validate_engine(config, facts)
        config, pool_note = resolve_prompt_pool(config, facts)
        config, window_note = resolve_prefill_window(config, facts)
        config, lookup_note = resolve_lookup(config, facts)
        config, fill_note = resolve_pool_fill(config, facts)
        raise_if_carry_unsupported(config, facts)
        compact = compaction_on(config, facts)
        draft_len = facts.draft_max_model_len if compact else None
        return cls(
            config=config,
            facts=facts,
            compaction_on=compact,
            draft_len=draft_len,
            min_view_context=config.min_view_context(
                draft_len, facts.num_speculative_tokens
            ),
            replicated_draft=replicated_draft(config, facts),
            engine_index=engine_index,
            prompt_pool_note=pool_note,
            prefill_window_note=window_note,
            lookup_note=lookup_note,
            pool_fill_note=fill_note,
        )

    @classmethod
    def from_vllm(cls, vllm_config) -> Settings:
        """The settings of ``vllm_config``, resolved on the first call for this
        config object. Without ``spec_extend`` in it, the config defaults."""
        key = id(vllm_config)
        if key in _RESOLVED:
            return _RESOLVED[key]
        settings = cls.resolve(
            SpecExtendConfig.from_dict(
                compat.additional_config(vllm_config).get(ADDITIONAL_CONFIG_KEY)
            ),
            EngineFacts(**compat.engine_facts(vllm_config)),
            compat.engine_index(vllm_config),
        )
        _remember(vllm_config, settings)
        return settings


_RESOLVED: dict[int, Settings] = {}
"""By ``id(vllm_config)``, dropped when that config is collected."""


def _remember(vllm_config, settings: Settings) -> None:
    key = id(vllm_config)
    try:
        weakref.finalize(vllm_config, _RESOLVED.pop, key, None)
    except TypeError:
        return  # no weak references (a test's stand-in): resolve each time
    _RESOLVED[key] = settings
