"""What an engine must be for SpecExtend to serve it, and what the config
becomes on it.

:class:`EngineFacts` are the parts of a resolved vLLM config the plugin
depends on; :func:`validate_engine` refuses a setup it cannot serve, naming
the fix; ``resolve_prompt_pool``, ``resolve_prefill_window`` and ``resolve_lookup``
turn ``draft_prompt_pool``, ``draft_prefill_window`` and ``lookup_tokens``
``"auto"`` into this engine's (``draft_pool_fill``'s in ``pool_fill.py``).
Pure functions raising :class:`SpecExtendConfigError`, so they run the same
at engine-config time, on a reconfigure and in unit tests. No vLLM import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from vllm_specextend.config.keys import SpecExtendConfig
from vllm_specextend.config.lookup import raise_if_lookup_unsupported
from vllm_specextend.config.pool_fill import raise_if_bad_pool_fill
from vllm_specextend.config.values import SpecExtendConfigError, score_layer_index

METHODS = ("draft_model", "eagle", "eagle3")


@dataclass(frozen=True)
class EngineFacts:
    """The parts of a resolved vLLM engine config that SpecExtend depends on."""

    has_speculative_config: bool
    method: str | None
    block_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    disable_padded_drafter_batch: bool = False
    max_model_len: int | None = None
    draft_max_model_len: int | None = None
    """The draft's max_model_len after vLLM caps it at the target's."""
    num_speculative_tokens: int = 0
    model: str | None = None
    """The target's model path or name."""
    draft_model: str | None = None
    """The draft's model path or name (the target's under ``self_draft``)."""
    num_target_attention_layers: int | None = None
    """The target's attention layers (vLLM's count; None if unknown)."""
    max_num_batched_tokens: int | None = None
    """The scheduler's token budget a step, the drafter's buffers' size."""
    data_parallel_size: int = 1
    """Data parallel ranks that run every forward together (an MoE target's;
    a dense target's ranks are independent engines: 1)."""
    target_position_rows: int = 1
    """Rows of the target's positions: 3 under M-RoPE (Qwen2-VL and its kin),
    its dimensions under XD-RoPE, else 1 (``compat.position_rows``)."""
    kv_cache_dtype: str = "auto"
    """vLLM's ``--kv-cache-dtype`` (``auto``: the model's dtype)."""
    draft_sample_method: str = "greedy"
    """The speculative config's ``draft_sample_method``: ``probabilistic``
    hands the rejection sampler every draft's probabilities."""
    draft_graph_tokens: int | None = None
    """The most tokens one draft forward replays as a CUDA graph (vLLM's
    capture sizes after its spec-decode rounding); None: the draft is eager."""


def compaction_on(cfg: SpecExtendConfig, facts: EngineFacts) -> bool:
    if cfg.compact_positions != "auto":
        return bool(cfg.compact_positions)
    if facts.draft_max_model_len is None or facts.max_model_len is None:
        return False
    return facts.draft_max_model_len < facts.max_model_len


def replicated_draft(cfg: SpecExtendConfig, facts: EngineFacts) -> bool:
    """Whether every TP rank holds the whole draft (``draft_placement``)."""
    # auto: sharded, as measured (the field's docstring).
    return facts.tensor_parallel_size > 1 and cfg.draft_placement == "replicated"


def _raise_if_bad_self_draft(cfg: SpecExtendConfig, facts: EngineFacts) -> None:
    if not cfg.self_draft:
        return
    if facts.method != "draft_model" or facts.draft_model != facts.model:
        raise SpecExtendConfigError(
            "spec_extend.self_draft drafts with the target itself, but the engine "
            f"has a separate {facts.method} draft ({facts.draft_model}); drop "
            "--speculative-model / the speculative method, or set self_draft to "
            "false."
        )
    if cfg.compact_positions is True:
        raise SpecExtendConfigError(
            "spec_extend.self_draft reads the target's own KV at its own "
            'positions; set compact_positions to false or "auto".'
        )


def validate_engine(cfg: SpecExtendConfig, facts: EngineFacts) -> None:
    """Reject engine setups SpecExtend cannot serve, naming the fix."""
    _raise_if_no_draft(facts)
    _raise_if_unsupported_method(facts)
    _raise_if_bad_self_draft(cfg, facts)
    _raise_if_draft_vocab_on_eagle(cfg, facts)
    _raise_if_replicated_not_draft_model(cfg, facts)
    raise_if_prefill_window_unsupported(cfg, facts)
    raise_if_prompt_pool_unsupported(cfg, facts)
    raise_if_bad_pool_fill(cfg, facts)
    raise_if_lookup_unsupported(cfg, facts)
    _raise_if_unpadded_drafter_batch(facts)
    _raise_if_chunk_not_block_multiple(cfg, facts)
    _raise_if_working_set_exceeds_draft(cfg, facts)
    _raise_if_pipeline_parallel(facts)
    _raise_if_fp8_keys_scored(cfg, facts)
    if facts.num_target_attention_layers is not None:
        score_layer_index(cfg, facts.num_target_attention_layers)


def _raise_if_no_draft(facts: EngineFacts) -> None:
    if not facts.has_speculative_config:
        raise SpecExtendConfigError(
            "--spec-extend needs a draft model: add --speculative-model DRAFT "
            "(alias of --spec-model) and --num-speculative-tokens K, or let the "
            "target draft for itself with --spec-extend '{\"self_draft\": true}'."
        )


def _raise_if_unsupported_method(facts: EngineFacts) -> None:
    if facts.method not in METHODS:
        raise SpecExtendConfigError(
            f"--spec-extend supports the speculative methods {METHODS}, got "
            f"{facts.method!r}. Pass a draft checkpoint with --speculative-model."
        )


def _raise_if_replicated_not_draft_model(cfg: SpecExtendConfig,
                                         facts: EngineFacts) -> None:
    if cfg.draft_placement != "replicated":
        return
    if cfg.self_draft or facts.method != "draft_model":
        what = "self_draft drafts with the target" if cfg.self_draft else (
            f"a {facts.method} head shares the target's sharded embedding")
        raise SpecExtendConfigError(
            f"spec_extend.draft_placement=\"replicated\" places a draft model "
            f"whole on every rank, but {what}. Use draft_placement \"auto\" "
            "or \"sharded\"."
        )


def _raise_if_draft_vocab_on_eagle(cfg: SpecExtendConfig, facts: EngineFacts) -> None:
    if cfg.draft_vocab is not None and facts.method != "draft_model":
        raise SpecExtendConfigError(
            f"spec_extend.draft_vocab cuts a draft model's vocabulary; the "
            f"{facts.method} head drafts from its own (an EAGLE-3 head's "
            "draft_vocab_size). Leave draft_vocab unset."
        )


def raise_if_prefill_window_unsupported(cfg: SpecExtendConfig,
                                        facts: EngineFacts) -> None:
    """At engine config, and when a benchmark reconfigures a live engine."""
    if cfg.draft_prefill_window in (None, "auto"):
        return  # "auto" never fails: resolve_prefill_window turns it off instead
    if cfg.policy == "full":
        raise SpecExtendConfigError(
            'spec_extend.draft_prefill_window reads prompts through the view, '
            'which policy "full" never builds; use policy "cmr" or "streaming", '
            "or leave draft_prefill_window unset."
        )
    _raise_if_not_a_draft_model_at_its_positions("draft_prefill_window", cfg, facts)


AUTO_PREFILL_WINDOW = 4096
"""``draft_prefill_window: "auto"``: the window measured on the real pair
(H100, 2026-12-06, night, ``benchmarks/results/realpair/20261206T2234Z_h100_pieces``):
against the full pass, accepted length -3.3% (other 16K) to +3.0% (copy 30K),
end to end +2% (copy 16K), +11% (copy 30K), +7% (copy 16K at batch 8),
+0.5% (other 16K). 2,048 was as fast but cost 7% of the other tasks'
accepted length."""


def resolve_prefill_window(cfg: SpecExtendConfig,
                           facts: EngineFacts) -> tuple[SpecExtendConfig, str | None]:
    """``cfg`` with ``draft_prefill_window: "auto"`` resolved for this engine:
    ``AUTO_PREFILL_WINDOW`` where the engine can window the draft's passes
    over a prompt, else None (full attention), and a line for the start-up
    log; a config that names its window (or null) comes back as it is, with
    None. After ``resolve_prompt_pool``: a pool bounds the pass instead."""
    if cfg.draft_prefill_window != "auto":
        return cfg, None
    why = None
    if cfg.policy == "full":
        why = 'policy "full" builds no view'
    elif cfg.draft_prompt_pool is not None:
        why = "draft_prompt_pool bounds the draft's pass over a prompt instead"
    else:
        refusal = _not_a_draft_model_at_its_positions("draft_prefill_window", cfg, facts)
        if refusal is not None:
            why = refusal[0].removeprefix("spec_extend.draft_prefill_window ")
            why = why.rstrip(";.:")
    if why is not None:
        return (dataclasses.replace(cfg, draft_prefill_window=None),
                f"full attention over every prompt ({why})")
    return (dataclasses.replace(cfg, draft_prefill_window=AUTO_PREFILL_WINDOW),
            f"{AUTO_PREFILL_WINDOW} tokens before each prompt piece")


def _raise_if_not_a_draft_model_at_its_positions(key: str, cfg: SpecExtendConfig,
                                                 facts: EngineFacts) -> None:
    """``key`` bounds a draft model's passes over a prompt, read at the
    prompt's own positions."""
    refusal = _not_a_draft_model_at_its_positions(key, cfg, facts)
    if refusal is not None:
        raise SpecExtendConfigError(" ".join(refusal))


def _not_a_draft_model_at_its_positions(key: str, cfg: SpecExtendConfig,
                                        facts: EngineFacts) -> tuple[str, str] | None:
    if cfg.self_draft or facts.method != "draft_model":
        what = "self_draft" if cfg.self_draft else f"the {facts.method} head"
        return (f"spec_extend.{key} bounds a draft model's passes over a prompt; "
                f"{what} writes no draft KV of its own there.", f"Leave {key} unset.")
    if compaction_on(cfg, facts):
        return (f"spec_extend.{key} reads the prompt at its own positions, but the "
                "draft's working set is compacted (a draft with fewer positions than "
                "the target, or compact_positions: true).",
                f"Leave {key} unset, or use a draft with the target's positions.")
    return None


def pooled_pass_tokens(cfg: SpecExtendConfig, num_spec_tokens: int) -> int:
    """Most tokens of one prompt's pooled pass (``draft_prompt_pool``): the
    sinks, the pool, a window that starts up to a chunk and K tokens early,
    and the next token."""
    return (cfg.sink_tokens + cfg.draft_prompt_pool * cfg.chunk_size
            + cfg.window_tokens + cfg.chunk_size + num_spec_tokens + 1)


def raise_if_prompt_pool_unsupported(cfg: SpecExtendConfig,
                                     facts: EngineFacts) -> None:
    """At engine config, and when a benchmark reconfigures a live engine
    (``"auto"`` never fails: ``resolve_prompt_pool`` turns it off instead)."""
    if cfg.draft_prompt_pool in (None, "auto"):
        return
    refusal = prompt_pool_refusal(cfg, facts)
    if refusal is not None:
        raise SpecExtendConfigError(" ".join(refusal))


def prompt_pool_refusal(cfg: SpecExtendConfig,
                        facts: EngineFacts) -> tuple[str, str] | None:
    """Why this engine cannot pool ``cfg.draft_prompt_pool`` chunks, and the
    fix; None where it can."""
    pool = cfg.draft_prompt_pool
    if cfg.policy != "cmr":
        return ("spec_extend.draft_prompt_pool keeps the chunks the target's "
                f'attention ranks top, which policy "{cfg.policy}" never ranks;',
                'use policy "cmr", or leave draft_prompt_pool unset.')
    if pool < cfg.top_k:
        return (f"spec_extend.draft_prompt_pool={pool} is below top_k={cfg.top_k}: "
                "every selection chooses its top_k chunks from the pool.",
                "Raise draft_prompt_pool, or leave it unset.")
    if cfg.draft_prefill_window not in (None, "auto"):  # "auto" steps aside
        return ("spec_extend.draft_prompt_pool and draft_prefill_window both bound "
                "the draft's pass over a prompt;", "set one of them.")
    refusal = _not_a_draft_model_at_its_positions("draft_prompt_pool", cfg, facts)
    if refusal is not None:
        return refusal
    if facts.target_position_rows > 1:
        return ("spec_extend.draft_prompt_pool places a pooled pass at its tokens' "
                "own positions, one row each, but the target's positions have "
                f"{facts.target_position_rows} rows (M-RoPE or XD-RoPE).",
                "Leave draft_prompt_pool unset.")
    if facts.data_parallel_size > 1:
        return ("spec_extend.draft_prompt_pool drops and adds draft forwards on one "
                "engine, but data parallel ranks run every draft forward together "
                f"(data_parallel_size={facts.data_parallel_size}).",
                "Leave draft_prompt_pool unset.")
    if facts.num_speculative_tokens >= cfg.chunk_size:
        return ("spec_extend.draft_prompt_pool needs num_speculative_tokens "
                f"({facts.num_speculative_tokens}) below chunk_size ({cfg.chunk_size}): "
                "the window's start moves back by up to K tokens, and the pool must "
                "still have its chunks before it.",
                "Raise chunk_size, or leave draft_prompt_pool unset.")
    budget = facts.max_num_batched_tokens
    need = pooled_pass_tokens(cfg, facts.num_speculative_tokens)
    if budget is not None and need > budget:
        return (f"spec_extend.draft_prompt_pool={pool} makes a pooled pass of up to "
                f"{need} tokens (sinks, pool and window) in one draft forward, more "
                f"than max_num_batched_tokens={budget}.",
                "Lower draft_prompt_pool, or raise --max-num-batched-tokens.")
    return None


AUTO_POOL_PER_TOP_K = 2
"""``draft_prompt_pool: "auto"`` pools this many times ``top_k`` chunks: 128
at the default top_k of 64, the pool measured as ``"auto"`` when top_k was
32 (4 times the view then; 2 times it now, not measured apart). At 3-4 times
the view's chunks the pooled pass cost no accepted tokens 40 real-weight
prompts could tell; pools under 1.5 times the view cost 3-6% in 6-prompt
hints (docs/evaluation.md, "A pooled prompt pass"). 4 times 64 chunks would
make a pass of 8,517 tokens, past vLLM serve's default step budget of 8,192
on an H100 (before the draft's slots went on top of it, 2026-12-07: 9,216
now), so "auto" would not have pooled there."""


def resolve_prompt_pool(cfg: SpecExtendConfig,
                        facts: EngineFacts) -> tuple[SpecExtendConfig, str | None]:
    """``cfg`` with ``draft_prompt_pool: "auto"`` resolved for this engine:
    ``AUTO_POOL_PER_TOP_K * top_k`` chunks where the engine can pool, else
    None (the draft's full pass), and a line that says which and why for the
    start-up log; a config that names its pool (or null) comes back as it is,
    with None. Every process of an engine resolves it alike: the API server
    and the engine cores see the same facts (``compat.engine_facts``)."""
    if cfg.draft_prompt_pool != "auto":
        return cfg, None
    pooled = dataclasses.replace(cfg, draft_prompt_pool=AUTO_POOL_PER_TOP_K * cfg.top_k)
    refusal = prompt_pool_refusal(pooled, facts)
    why = None if refusal is None else refusal[0].removeprefix("spec_extend.").rstrip(";.:")
    if why is None and facts.max_model_len is not None \
            and facts.max_model_len < pooled.pool_min_prompt:
        why = (f"max_model_len={facts.max_model_len} is below the "
               f"{pooled.pool_min_prompt} tokens from which a prompt is pooled")
    if why is not None:
        return (dataclasses.replace(cfg, draft_prompt_pool=None),
                f"the draft's full pass over every prompt ({why})")
    return pooled, (f"{pooled.draft_prompt_pool} chunks for prompts from "
                    f"{pooled.pool_min_prompt} tokens")


def _raise_if_fp8_keys_scored(cfg: SpecExtendConfig, facts: EngineFacts) -> None:
    # The scoring kernel reads fp16, bf16 or fp32 keys (scoring_triton.py).
    if cfg.policy == "cmr" and facts.kv_cache_dtype.startswith("fp8"):
        raise SpecExtendConfigError(
            f"spec_extend.policy \"cmr\" ranks chunks by the target's keys, which "
            f"--kv-cache-dtype {facts.kv_cache_dtype} stores as fp8, a format its "
            "scoring does not read; use --kv-cache-dtype auto."
        )


def _raise_if_unpadded_drafter_batch(facts: EngineFacts) -> None:
    if facts.disable_padded_drafter_batch:
        raise SpecExtendConfigError(
            "--spec-extend needs the padded drafter batch; unset "
            "disable_padded_drafter_batch in the speculative config."
        )


def _raise_if_chunk_not_block_multiple(
    cfg: SpecExtendConfig, facts: EngineFacts
) -> None:
    if cfg.chunk_size % facts.block_size:
        raise SpecExtendConfigError(
            f"spec_extend.chunk_size={cfg.chunk_size} must be a multiple of the KV "
            f"block size {facts.block_size}; pass --block-size {cfg.chunk_size} or "
            f"a chunk_size that is a multiple of {facts.block_size}."
        )


def _raise_if_working_set_exceeds_draft(
    cfg: SpecExtendConfig, facts: EngineFacts
) -> None:
    """With compaction the draft spans the working set at contiguous
    positions, which must fit its own max_model_len."""
    if not compaction_on(cfg, facts) or facts.draft_max_model_len is None:
        return
    need = cfg.working_set_tokens(facts.num_speculative_tokens)
    if cfg.policy != "full" and need > facts.draft_max_model_len:
        raise SpecExtendConfigError(
            f"The draft's working set needs up to {need} positions (sink_tokens "
            f"+ top_k*chunk_size + recent_tokens + retrieve_every*(K+1) + "
            f"chunk_size + 2K) but the draft has {facts.draft_max_model_len}; "
            "lower top_k, recent_tokens or retrieve_every, or use a draft with "
            "more positions."
        )


def _raise_if_pipeline_parallel(facts: EngineFacts) -> None:
    if facts.pipeline_parallel_size != 1:
        raise SpecExtendConfigError(
            "--spec-extend runs with pipeline parallel size 1 (got "
            f"PP={facts.pipeline_parallel_size}); use --tensor-parallel-size instead."
        )
