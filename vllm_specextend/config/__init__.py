"""Configuration: the ``--spec-extend`` keys and what an engine must be to serve them.

``keys`` holds :class:`SpecExtendConfig` (every key, its default and why),
``values`` the values each key may take and the error that names a bad one,
``engine`` the engine facts the plugin depends on and the checks of a resolved
engine, ``lookup`` those of ``lookup_tokens`` and its ``"auto"``,
``pool_fill`` those of ``draft_pool_fill`` and its ``"auto"``. All of it
is re-exported here, so ``vllm_specextend.config.X`` names what it always
named. Pure Python, no vLLM import: every room may import it.
"""

from vllm_specextend.config.engine import (
    AUTO_POOL_PER_TOP_K,
    AUTO_PREFILL_WINDOW,
    METHODS,
    EngineFacts,
    compaction_on,
    pooled_pass_tokens,
    prompt_pool_refusal,
    raise_if_prefill_window_unsupported,
    raise_if_prompt_pool_unsupported,
    replicated_draft,
    resolve_prefill_window,
    resolve_prompt_pool,
    validate_engine,
)
from vllm_specextend.config.keys import ADDITIONAL_CONFIG_KEY, SpecExtendConfig
from vllm_specextend.config.lookup import (
    AUTO_LOOKUP_DRAFTED,
    AUTO_LOOKUP_MIN_K,
    raise_if_carry_unsupported,
    raise_if_lookup_unsupported,
    resolve_lookup,
)
from vllm_specextend.config.pool_fill import (
    AUTO_POOL_FILL,
    raise_if_bad_pool_fill,
    resolve_pool_fill,
)
from vllm_specextend.config.values import (
    DRAFT_GRAPH_MODES,
    DRAFT_PLACEMENTS,
    POLICIES,
    SpecExtendConfigError,
    check_values,
    score_layer_index,
)

__all__ = [
    "ADDITIONAL_CONFIG_KEY",
    "AUTO_LOOKUP_DRAFTED",
    "AUTO_LOOKUP_MIN_K",
    "AUTO_POOL_FILL",
    "AUTO_POOL_PER_TOP_K",
    "AUTO_PREFILL_WINDOW",
    "DRAFT_GRAPH_MODES",
    "DRAFT_PLACEMENTS",
    "METHODS",
    "POLICIES",
    "EngineFacts",
    "SpecExtendConfig",
    "SpecExtendConfigError",
    "check_values",
    "compaction_on",
    "pooled_pass_tokens",
    "prompt_pool_refusal",
    "raise_if_carry_unsupported",
    "raise_if_lookup_unsupported",
    "raise_if_prefill_window_unsupported",
    "raise_if_prompt_pool_unsupported",
    "replicated_draft",
    "resolve_lookup",
    "raise_if_bad_pool_fill",
    "resolve_pool_fill",
    "resolve_prefill_window",
    "resolve_prompt_pool",
    "score_layer_index",
    "validate_engine",
]
