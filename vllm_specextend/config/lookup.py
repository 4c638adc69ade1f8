"""What ``lookup_tokens`` (``drafting/lookup.py``) needs of an engine, and
what ``"auto"`` becomes on one.

Why its own file: the lookup's refusals serve both the explicit count (a
refusal naming the fix, at engine config and on a reconfigure) and
``"auto"`` (the same reasons turn it off, logged at start). Pure functions;
no vLLM import.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from vllm_specextend.config.keys import SpecExtendConfig
from vllm_specextend.config.values import SpecExtendConfigError

if TYPE_CHECKING:
    from vllm_specextend.config.engine import EngineFacts


def raise_if_lookup_unsupported(cfg: SpecExtendConfig, facts: EngineFacts) -> None:
    """At engine config, and when a benchmark reconfigures a live engine
    (``"auto"`` never fails: ``resolve_lookup`` turns it off instead)."""
    m = cfg.lookup_tokens
    if m in (0, "auto"):
        return
    refusal = lookup_refusal(m, facts)
    if refusal is not None:
        raise SpecExtendConfigError(" ".join(refusal))


def lookup_refusal(m: int, facts: EngineFacts) -> tuple[str, str] | None:
    """Why ``lookup_tokens: m`` (> 0) cannot run on this engine, and the fix
    (as ``config.prompt_pool_refusal``); None where it can."""
    k = facts.num_speculative_tokens
    if m >= k:
        return (f"spec_extend.lookup_tokens={m} leaves no draft forward of the "
                f"num_speculative_tokens={k} a step proposes (the draft model drafts "
                "K - lookup_tokens).",
                f"Lower lookup_tokens below {k}, or raise --num-speculative-tokens.")
    if facts.draft_sample_method == "probabilistic":
        return ("spec_extend.lookup_tokens proposes tokens without draft "
                "probabilities, but draft_sample_method is \"probabilistic\" (vLLM's "
                "rejection sampler reads every draft's).",
                "Set draft_sample_method to \"greedy\" in the speculative config "
                "(vLLM's default), or lookup_tokens to 0.")
    if facts.data_parallel_size > 1:
        return ("spec_extend.lookup_tokens drafts K - lookup_tokens tokens a step, "
                "but data parallel ranks run every draft forward together and an "
                f"idle rank's dummy run drafts K (data_parallel_size="
                f"{facts.data_parallel_size}).", "Set lookup_tokens to 0.")
    if facts.target_position_rows > 1:
        return ("spec_extend.lookup_tokens keeps each request's tokens by position, "
                f"one row, but the target's positions have {facts.target_position_rows} "
                "rows (M-RoPE or XD-RoPE).", "Set lookup_tokens to 0.")
    return None


AUTO_LOOKUP_MIN_K = 8
"""``lookup_tokens: "auto"`` looks up from this K: K=8 with 5 looked up is
measured on the real pair (docs/evaluation.md, 2026-12-06); K=4 without
the lookup is too, and lower K with it is not."""

AUTO_LOOKUP_DRAFTED = 3
"""Tokens the draft model drafts a step under ``lookup_tokens: "auto"``: the
rest of K is looked up. 3 (of 8) ran faster than 1 (of 5) on every real-pair
cell measured: its drafts carry the key past where the lookup alone stops."""


def resolve_lookup(cfg: SpecExtendConfig,
                   facts: EngineFacts) -> tuple[SpecExtendConfig, str | None]:
    """``cfg`` with ``lookup_tokens: "auto"`` resolved for this engine:
    ``K - AUTO_LOOKUP_DRAFTED`` with a draft model at K of
    ``AUTO_LOOKUP_MIN_K`` or more where the engine allows it, else 0, and a
    line that says which and why for the start-up log; a config that names a
    count comes back as it is, with None."""
    if cfg.lookup_tokens != "auto":
        return cfg, None
    k = facts.num_speculative_tokens
    m = k - AUTO_LOOKUP_DRAFTED
    if facts.method != "draft_model":
        why = f"the {facts.method} method (measured with a draft model only)"
    elif k < AUTO_LOOKUP_MIN_K:
        why = (f"num_speculative_tokens={k} is below {AUTO_LOOKUP_MIN_K}, from "
               "which it is measured")
    else:
        refusal = lookup_refusal(m, facts)
        why = (None if refusal is None
               else refusal[0].removeprefix("spec_extend.").rstrip(";.:"))
    if why is not None:
        return dataclasses.replace(cfg, lookup_tokens=0), f"off ({why})"
    return (dataclasses.replace(cfg, lookup_tokens=m),
            f"{m} of {k} tokens a step looked up, {AUTO_LOOKUP_DRAFTED} drafted")


def raise_if_carry_unsupported(cfg: SpecExtendConfig, facts: EngineFacts) -> None:
    """``carry_drafts`` on a config whose ``lookup_tokens`` is resolved
    (``resolve_lookup``): the lookup must be on and leave more than
    ``carry_drafts`` tokens to the draft model."""
    carry = cfg.carry_drafts
    if carry is None:
        return
    if cfg.lookup_tokens == "auto":
        raise ValueError("lookup_tokens \"auto\" is resolved per engine first "
                         "(config.resolve_lookup)")
    k, m = facts.num_speculative_tokens, cfg.lookup_tokens
    if not m:
        raise SpecExtendConfigError(
            f"spec_extend.carry_drafts={carry} drafts fewer tokens on steps the "
            f"lookup carries, but the lookup is off here (lookup_tokens resolved "
            f"to 0 at num_speculative_tokens={k}; \"auto\" looks up from K="
            f"{AUTO_LOOKUP_MIN_K} with a draft model). Raise "
            "--num-speculative-tokens, set lookup_tokens, or drop carry_drafts.")
    if facts.tensor_parallel_size > 1:
        raise SpecExtendConfigError(
            f"spec_extend.carry_drafts={carry} lets each rank choose its step's "
            "draft count from its own host copy of the signal, which lands at "
            "its own time, and the ranks' draft forwards must run together "
            f"(tensor_parallel_size={facts.tensor_parallel_size}). Drop "
            "carry_drafts under tensor parallelism.")
    if carry >= k - m:
        raise SpecExtendConfigError(
            f"spec_extend.carry_drafts={carry} must be below the {k - m} tokens "
            f"a step drafts (num_speculative_tokens={k} less lookup_tokens={m}). "
            f"Lower carry_drafts below {k - m}, or drop it.")
