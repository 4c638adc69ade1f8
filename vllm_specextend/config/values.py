"""The values each ``spec_extend`` key may take, and the checks that refuse others.

Each check raises :class:`SpecExtendConfigError` naming the key and the fix;
``check_values`` runs them all when a ``keys.SpecExtendConfig``
is built, so a bad value fails alike at CLI parse time, at engine-config time
and in unit tests. Pure functions; no vLLM import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_specextend.config.keys import SpecExtendConfig

POLICIES = ("cmr", "streaming", "full")
DRAFT_GRAPH_MODES = ("auto", "off", "static")
DRAFT_PLACEMENTS = ("auto", "sharded", "replicated")


class SpecExtendConfigError(ValueError):
    """A bad ``--spec-extend`` value or an engine setup SpecExtend cannot serve."""


def check_values(cfg: SpecExtendConfig) -> None:
    """Every key's check, in the order ``SpecExtendConfig`` always ran them."""
    _raise_if_unknown_policy(cfg)
    _raise_if_out_of_range(cfg)
    _raise_if_flags_not_bool(cfg)
    _raise_if_bad_score_layer(cfg)
    _raise_if_bad_optional_counts(cfg)
    _raise_if_bad_compact_positions(cfg)
    _raise_if_bad_draft_graph(cfg)
    _raise_if_bad_draft_placement(cfg)
    _raise_if_bad_lookup_tokens(cfg)
    _raise_if_bad_carry_drafts(cfg)
    _raise_if_sinks_not_whole_chunks(cfg)


_INT_RANGES = (
    ("chunk_size", 1),
    ("top_k", 1),
    ("retrieve_every", 1),
    ("sink_tokens", 0),
    ("recent_tokens", 0),
    ("min_context", 0),
)


def _raise_if_unknown_policy(cfg: SpecExtendConfig) -> None:
    if cfg.policy not in POLICIES:
        raise SpecExtendConfigError(
            f"spec_extend.policy={cfg.policy!r} is not one of {POLICIES}."
        )


def _raise_if_out_of_range(cfg: SpecExtendConfig) -> None:
    for name, low in _INT_RANGES:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise SpecExtendConfigError(
                f"spec_extend.{name}={value!r} must be an integer >= {low}."
            )


def _raise_if_flags_not_bool(cfg: SpecExtendConfig) -> None:
    for name in ("self_draft", "defer_prefill_draft"):
        value = getattr(cfg, name)
        if not isinstance(value, bool):
            raise SpecExtendConfigError(
                f"spec_extend.{name}={value!r} must be true or false."
            )


def _raise_if_bad_score_layer(cfg: SpecExtendConfig) -> None:
    value = cfg.score_layer
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecExtendConfigError(
            f"spec_extend.score_layer={value!r} must be an integer: an index "
            "into the target's attention layers (-1: the final one)."
        )


_OPTIONAL_COUNTS = (
    ("draft_vocab", "the first token ids drafts may use",
     "the whole vocabulary"),
    ("draft_prefill_window", "tokens before each prompt chunk the draft "
     "attends to", "full attention over the prompt"),
    ("draft_prompt_pool", "prompt chunks the draft computes its KV of",
     "the draft's pass over every prompt token"),
    ("draft_pool_fill", "chunks each refresh adds to a pooled prompt's draft KV",
     "a pool fixed at the prompt's end"),
)


def _raise_if_bad_optional_counts(cfg: SpecExtendConfig) -> None:
    for name, meaning, unset in _OPTIONAL_COUNTS:
        value = getattr(cfg, name)
        auto = name in ("draft_prompt_pool", "draft_prefill_window",
                        "draft_pool_fill")  # with "auto"
        if auto and value == "auto":
            continue
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, int) or value < 1):
            also = ', "auto"' if auto else ""
            raise SpecExtendConfigError(
                f"spec_extend.{name}={value!r} must be a positive integer "
                f"({meaning}){also} or null for {unset}."
            )


def score_layer_index(cfg: SpecExtendConfig, num_layers: int) -> int:
    """``cfg.score_layer`` as 0..num_layers-1 (-1 and num_layers-1 name one
    layer), or the error naming the range. At engine config (vLLM's count of
    attention layers), when the layer is looked up among the loaded ones, and
    when a benchmark reconfigures a live engine."""
    if not -num_layers <= cfg.score_layer < num_layers:
        raise SpecExtendConfigError(
            f"spec_extend.score_layer={cfg.score_layer} is outside the target's "
            f"{num_layers} attention layers; use {-num_layers}..{num_layers - 1} "
            "(-1: the final one)."
        )
    return cfg.score_layer % num_layers


def _raise_if_bad_compact_positions(cfg: SpecExtendConfig) -> None:
    value = cfg.compact_positions
    if not isinstance(value, bool) and value != "auto":
        raise SpecExtendConfigError(
            f"spec_extend.compact_positions={value!r} must be "
            '"auto", true or false.'
        )


def _raise_if_bad_draft_graph(cfg: SpecExtendConfig) -> None:
    if cfg.draft_graph not in DRAFT_GRAPH_MODES:
        raise SpecExtendConfigError(
            f"spec_extend.draft_graph={cfg.draft_graph!r} must be one of "
            f"{DRAFT_GRAPH_MODES}."
        )


def _raise_if_sinks_not_whole_chunks(cfg: SpecExtendConfig) -> None:
    if cfg.sink_tokens % cfg.chunk_size:
        raise SpecExtendConfigError(
            f"spec_extend.sink_tokens={cfg.sink_tokens} must be a multiple of "
            f"chunk_size={cfg.chunk_size} (sinks are whole chunks)."
        )


def _raise_if_bad_draft_placement(cfg: SpecExtendConfig) -> None:
    if cfg.draft_placement not in DRAFT_PLACEMENTS:
        raise SpecExtendConfigError(
            f"spec_extend.draft_placement={cfg.draft_placement!r} must be one "
            f"of {DRAFT_PLACEMENTS}."
        )


def _raise_if_bad_lookup_tokens(cfg: SpecExtendConfig) -> None:
    value = cfg.lookup_tokens
    if value != "auto" and (isinstance(value, bool) or not isinstance(value, int)
                            or value < 0):
        raise SpecExtendConfigError(
            f"spec_extend.lookup_tokens={value!r} must be an integer >= 0 "
            '(0: off) or "auto".'
        )


def _raise_if_bad_carry_drafts(cfg: SpecExtendConfig) -> None:
    value = cfg.carry_drafts
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise SpecExtendConfigError(
            f"spec_extend.carry_drafts={value!r} must be an integer >= 1 (the "
            "first draft forward writes the draft's KV) or null (off)."
        )
