"""SpecExtend configuration: parsing, defaults and validation.

The config travels inside vLLM's free-form ``additional_config["spec_extend"]``
(vLLM's ``SpeculativeConfig`` forbids extra keys), so it reaches every worker and
is hashed into the compile key. Defaults follow the SpecExtend paper (32-token
chunks, top-32 chunks, retrieval every 4 steps).

All checks here are pure functions raising :class:`SpecExtendConfigError`, so
they run the same at CLI parse time, at engine-config time and in unit tests.
No vLLM import.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

ADDITIONAL_CONFIG_KEY = "spec_extend"
POLICIES = ("cmr", "streaming", "full")
DRAFT_GRAPH_MODES = ("auto", "off", "static")
DRAFT_PLACEMENTS = ("auto", "sharded", "replicated")
METHODS = ("draft_model", "eagle", "eagle3")


class SpecExtendConfigError(ValueError):
    """A bad ``--spec-extend`` value or an engine setup SpecExtend cannot serve."""


@dataclass(frozen=True)
class SpecExtendConfig:
    """What the draft model sees of a long context.

    ``cmr``: sink tokens + the ``top_k`` chunks the target's scoring layer attended
    to most + a recent window. ``streaming``: sinks + a recent window of the same
    token budget (the paper's StreamingLLM baseline). ``full``: plain vLLM draft.
    """

    policy: str = "cmr"
    chunk_size: int = 32
    top_k: int = 32
    retrieve_every: int = 4
    sink_tokens: int = 32
    recent_tokens: int = 256
    min_context: int = 2048
    score_layer: int = -1
    """Which of the target's attention layers ranks the chunks, indexed as a
    Python list of its attention layers in model order: -1 is the final one
    (the paper's choice). A small model may retrieve better from a middle
    layer: SmolLM2-135M's final layer ranks a passkey's chunk among its top
    11 for 15-32% of the answer's queries at 8K and 4K, its layer 21 of 30 for
    87-93%, and drafting for itself at 8K it reproduced the key in 3-4 of 14
    cases with the final layer, 12 of 14 with layer 21 (docs/evaluation.md).
    Fixed when the engine starts: the query capture is recorded in the
    target's CUDA graphs."""
    compact_positions: bool | str = "auto"
    """Renumber the draft's working set to contiguous positions (``rope.py``),
    so a draft with fewer positions than the target can still draft. ``auto``:
    on when the draft's max_model_len is below the target's."""
    self_draft: bool = False
    """The target drafts for itself through the view of its own KV
    (``self_draft.py``): no draft model, no draft KV."""
    draft_graph: str = "auto"
    """The whole draft routine as one CUDA graph per batch size
    (``draft_graph.py``). ``auto``: captured where the engine allows it (CUDA,
    FlashAttention, CUDA graphs on, TP=1, a draft model); ``off``: vLLM's
    piecewise draft graphs; ``static``: the captured routine's code run
    without capturing (tests and debugging)."""
    defer_prefill_draft: bool = True
    """A step that only computes prompt chunks which end no prompt keeps its
    draft pass for the next step that drafts (``deferral.py``), so the first
    token does not wait for the draft's passes over a long prompt; a step
    whose other rows decode keeps its chunk rows' pass and drafts the rest
    (``kept_passes.py``). A draft model only; EAGLE heads and ``self_draft``
    draft in the target's step."""
    draft_vocab: int | None = None
    """Greedy drafts come from the first ``draft_vocab`` token ids only: the
    drafter's logits are computed over those rows of its ``lm_head`` (a view,
    no copy). BPE vocabularies number tokens in merge order, which roughly
    follows frequency: the first quarter of SmolLM2's 49K ids holds 89-90%
    of the evaluation's document tokens (``benchmarks/longinput/vocab_coverage.py``;
    a 128K vocabulary is not measured yet). A 1B draft's ``lm_head`` is
    0.53 GB of the 2.5 GB each draft token reads (docs/design.md). Lossless
    either way (the target verifies every draft); a draft whose token lies
    past the cut is rejected: with real weights a cut to a quarter of the
    ids lost 9-11% of the accepted length (docs/evaluation.md). None: the whole
    vocabulary. A draft model or ``self_draft`` (an EAGLE-3 head has its own
    draft vocabulary); sampled (non-greedy) drafts use the whole vocabulary."""
    draft_prefill_window: int | None = None
    """The draft's passes over a prompt attend to the sinks, the last
    ``draft_prefill_window`` tokens before each chunk and the chunk, through
    the same block-table view as its decode steps: the draft's attention over a
    prompt grows linearly with it instead of quadratically. On an H100 the
    1B draft's passes over a 16K prompt took a quarter of the target's time,
    more than its share of the weights (docs/results.md; issue #22). Its KV of
    the prompt then holds what each token saw of that window, which the draft
    later reads through its working set. Lossless either way (the target
    verifies every draft); the draft's acceptance may change (about 1% for
    a window of 2,048 at 8K with real weights, docs/evaluation.md). None: full
    attention over the prompt, as vLLM's draft. A draft model only, at its
    own positions (not with compacted positions or ``self_draft``), under the
    ``cmr`` or ``streaming`` policy; a step whose K vLLM set to 0 drafts
    nothing and writes its chunk's draft KV in full."""

    draft_prompt_pool: int | str | None = "auto"
    """The draft computes its KV of a long prompt only where its views will
    read it: the sinks, the ``draft_prompt_pool`` chunks the target's scoring
    attention ranks top at the prompt's end, and the recent window, in one
    pass at the step that ends the prompt (``prompt_pool.py``); its passes
    over the prompt's earlier chunks are dropped, and every later selection
    chooses among those chunks and the ones after the window's start. A 1B
    draft's pass over a 32K prompt took ~230 ms on an H200, 16% of the first
    token's time at batch 1 and +19% for the last first token of eight
    (issue #45); a pool of 128 chunks is ~4.4K tokens. Lossless either way
    (the target verifies every draft); the draft's acceptance may change
    (its pooled KV saw only the pool: 1.001 of the full pass's accepted
    tokens, 0.991-1.012, over 40 real-weight prompts at the share 128 chunks
    hold of 32K; docs/evaluation.md). ``"auto"`` (the default):
    ``AUTO_POOL_PER_TOP_K`` × ``top_k`` chunks (128 at the default top_k)
    where this engine can pool, else the full pass, logged at start with the
    reason (``resolve_prompt_pool``). None: the draft's full pass over every
    prompt, as vLLM's. A number needs a draft model at its own positions
    under ``cmr`` (not with compacted positions, ``draft_prefill_window`` or
    ``self_draft``), at least ``top_k``. Prompts shorter than
    ``pool_min_prompt`` pass in full."""

    draft_placement: str = "auto"
    """Where a draft model runs under tensor parallelism (``replicated.py``).
    ``sharded``: split over the ranks as the target (vLLM's draft_model);
    every draft forward all-reduces twice a layer, inside the captured
    routine. ``replicated``: the whole draft, its weights and KV, on every
    rank, and no collective in a draft forward. ``auto``: sharded, the
    measured choice: with the 1B draft beside an 8B target at TP=2 on two
    H100s, 285 tok/s sharded against 251 replicated (docs/results.md,
    "Tensor parallel"). Without TP both are the same. Replicated is a draft
    model's only (an EAGLE head shares the target's sharded embedding;
    ``self_draft`` is the target)."""

    def __post_init__(self) -> None:
        _raise_if_unknown_policy(self)
        _raise_if_out_of_range(self)
        _raise_if_flags_not_bool(self)
        _raise_if_bad_score_layer(self)
        _raise_if_bad_optional_counts(self)
        _raise_if_bad_compact_positions(self)
        _raise_if_bad_draft_graph(self)
        _raise_if_bad_draft_placement(self)
        _raise_if_sinks_not_whole_chunks(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SpecExtendConfig:
        if data is None:
            return cls()
        _raise_if_not_object(data)
        _raise_if_unknown_keys(data)
        return cls(**data)

    @classmethod
    def from_json(cls, text: str | None) -> SpecExtendConfig:
        if text is None or not text.strip():
            return cls()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpecExtendConfigError(
                f"--spec-extend expects a JSON object, got {text!r}: {e}"
            ) from e
        if not isinstance(data, dict):
            raise SpecExtendConfigError(
                f"--spec-extend expects a JSON object, got {text!r}."
            )
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def draft_budget_tokens(self) -> int:
        """Context tokens the draft keeps besides its recent window."""
        return self.sink_tokens + self.top_k * self.chunk_size

    def working_set_tokens(self, num_spec_tokens: int) -> int:
        """Most positions the draft spans through a view: sinks, selected chunks,
        the recent window (chunk-aligned, so up to one chunk longer), the
        tokens added until the next refresh, and the step's own drafts."""
        growth = self.retrieve_every * (num_spec_tokens + 1)
        return (
            self.draft_budget_tokens
            + self.recent_tokens
            + growth
            + self.chunk_size
            + 2 * num_spec_tokens
        )

    def min_view_context(self, draft_max_len: int | None, num_spec_tokens: int) -> int:
        """Context length from which a row must draft through a view.

        With compaction the draft cannot see a context longer than its own
        positions, so ``min_context`` is lowered to keep every row that could
        outgrow them this step (prompt or decode) on a view.
        """
        if draft_max_len is None:
            return self.min_context
        return max(0, min(self.min_context, draft_max_len - 2 * num_spec_tokens - 1))

    @property
    def pool_min_prompt(self) -> int | None:
        """Prompt length from which the draft's pass over it is pooled
        (``draft_prompt_pool``): past what the sinks, the pool and the window
        hold, with a chunk to spare on each side; None: never."""
        if self.draft_prompt_pool is None:
            return None
        if self.draft_prompt_pool == "auto":
            raise ValueError("draft_prompt_pool \"auto\" is resolved per engine "
                             "first (config.resolve_prompt_pool)")
        pooled = (self.sink_tokens + (self.draft_prompt_pool + 2) * self.chunk_size
                  + self.recent_tokens)
        return max(self.min_context, pooled)

    @property
    def window_tokens(self) -> int:
        """Recent window length; ``streaming`` spends the top-k budget on it."""
        if self.policy == "streaming":
            return self.recent_tokens + self.top_k * self.chunk_size
        return self.recent_tokens


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
    _raise_if_unpadded_drafter_batch(facts)
    _raise_if_chunk_not_block_multiple(cfg, facts)
    _raise_if_working_set_exceeds_draft(cfg, facts)
    _raise_if_pipeline_parallel(facts)
    _raise_if_fp8_keys_scored(cfg, facts)
    if facts.num_target_attention_layers is not None:
        score_layer_index(cfg, facts.num_target_attention_layers)


# --- guards: each raises SpecExtendConfigError naming the key and the fix -------

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
)


def _raise_if_bad_optional_counts(cfg: SpecExtendConfig) -> None:
    for name, meaning, unset in _OPTIONAL_COUNTS:
        value = getattr(cfg, name)
        auto = name == "draft_prompt_pool"  # the one with an "auto"
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


def _raise_if_not_object(data: Any) -> None:
    if not isinstance(data, dict):
        raise SpecExtendConfigError(
            f"spec_extend must be a JSON object (or null), got {data!r}."
        )


def _raise_if_unknown_keys(data: dict[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(SpecExtendConfig)}
    unknown = sorted(set(data) - known, key=str)
    if unknown:
        raise SpecExtendConfigError(
            f"Unknown spec_extend key(s) {unknown}; valid keys are {sorted(known)}."
        )


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


def _raise_if_bad_draft_placement(cfg: SpecExtendConfig) -> None:
    if cfg.draft_placement not in DRAFT_PLACEMENTS:
        raise SpecExtendConfigError(
            f"spec_extend.draft_placement={cfg.draft_placement!r} must be one "
            f"of {DRAFT_PLACEMENTS}."
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
    if cfg.draft_prefill_window is None:
        return
    if cfg.policy == "full":
        raise SpecExtendConfigError(
            'spec_extend.draft_prefill_window reads prompts through the view, '
            'which policy "full" never builds; use policy "cmr" or "streaming", '
            "or leave draft_prefill_window unset."
        )
    _raise_if_not_a_draft_model_at_its_positions("draft_prefill_window", cfg, facts)


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
    if cfg.draft_prefill_window is not None:
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


AUTO_POOL_PER_TOP_K = 4
"""``draft_prompt_pool: "auto"`` pools this many times ``top_k`` chunks: at
3-4 times the view's chunks the pooled pass cost no accepted tokens 40
real-weight prompts could tell; pools under 1.5 times the view cost 3-6% in
6-prompt hints (docs/evaluation.md, "A pooled prompt pass")."""


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
