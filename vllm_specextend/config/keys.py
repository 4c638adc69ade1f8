"""The ``spec_extend`` keys: :class:`SpecExtendConfig`, its defaults and parsing.

The config travels inside vLLM's free-form ``additional_config["spec_extend"]``
(vLLM's ``SpeculativeConfig`` forbids extra keys), so it reaches every worker and
is hashed into the compile key. Defaults follow the SpecExtend paper (32-token
chunks, retrieval every 4 steps) except ``top_k``: 64 chunks, not the paper's
32, on real weights (``SpecExtendConfig.top_k``). Each value is checked when a
config is built (``values``); what an engine can serve, in ``engine``.
No vLLM import.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from vllm_specextend.config.values import SpecExtendConfigError, check_values

ADDITIONAL_CONFIG_KEY = "spec_extend"


@dataclass(frozen=True)
class SpecExtendConfig:
    """What the draft model sees of a long context.

    ``cmr``: sink tokens + the ``top_k`` chunks the target's scoring layer attended
    to most + a recent window. ``streaming``: sinks + a recent window of the same
    token budget (the paper's StreamingLLM baseline). ``full``: plain vLLM draft.
    """

    policy: str = "cmr"
    chunk_size: int = 32
    top_k: int = 64
    """Chunks in each selection. 64 since 2026-12-06 (the paper's 32 before):
    on the real pair (Qwen2.5-Coder-1.5B drafted by its 0.5B, H100) it raised
    the accepted length on copy tasks from 4.34 to 4.54 at 16K and from 3.69
    to 3.88 at 30K, 0.96x and 0.95x of full-KV drafting, end to end unchanged
    (benchmarks/results/realpair/20261206T0828Z_h100_levers)."""
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
    draft_prefill_window: int | str | None = "auto"
    """The draft's passes over a prompt attend to the sinks, the last
    ``draft_prefill_window`` tokens before each chunk and the chunk, through
    the same block-table view as its decode steps, and inside a chunk each
    piece of 1,024 tokens to the sinks, the window before the piece and the
    piece (``drafting/prompt_split.py``; a chunk's last token, where it
    samples, reads the whole context): the draft's attention over a prompt
    grows linearly with it instead of quadratically. On an H100 the
    1B draft's passes over a 16K prompt took a quarter of the target's time,
    more than its share of the weights (docs/results.md; issue #22). Its KV of
    the prompt then holds what each token saw of that window, which the draft
    later reads through its working set. Lossless either way (the target
    verifies every draft); the draft's acceptance may change (about 1% for
    a window of 2,048 at 8K with real weights, docs/evaluation.md). None: full
    attention over the prompt, as vLLM's draft. A draft model only, at its
    own positions (not with compacted positions or ``self_draft``), under the
    ``cmr`` or ``streaming`` policy; a step whose K vLLM set to 0 drafts
    nothing and writes its chunk's draft KV in full. ``"auto"`` (the
    default since 2026-12-06, night; ``config.resolve_prefill_window``):
    ``AUTO_PREFILL_WINDOW`` (4,096) where the engine can and no
    ``draft_prompt_pool`` bounds the pass instead (by default one does, since
    2026-12-07), else None, the start-up log says which and why. On the real
    pair (H100, 16 prompts a cell, K=12) 4,096 kept the accepted length
    within -3.3% to +3.0% of the full pass and ran copy tasks at 30K 1.11x
    faster end to end
    (docs/evaluation.md, "The draft's pass windowed inside a chunk")."""

    draft_prompt_pool: int | str | None = "auto"
    """A number N or ``"auto"`` (the default since 2026-12-07:
    ``AUTO_POOL_PER_TOP_K`` × ``top_k`` chunks, 128 at the default top_k,
    where this engine can pool, else the full pass, logged at start with the
    reason: ``resolve_prompt_pool``): the draft computes its KV of a long
    prompt only where its views will read it: the sinks, the N chunks the
    target's scoring attention ranks top at the prompt's end, and the recent
    window, in one pass at the step that ends the prompt
    (``drafting/prompt_pool.py``); its passes over the prompt's earlier
    chunks are dropped, and each later refresh adds ``draft_pool_fill``
    chunks. A 1B draft's pass over a 32K prompt took ~230 ms on an H200, 16%
    of the first token's time at batch 1 and +19% for the last first token
    of eight (issue #45). Lossless either way (the target verifies every
    draft). A pool alone (``draft_pool_fill: null``) loses acceptance where
    an answer copies chunks it left out: on the real Qwen2.5-Coder pair
    (docs/evaluation.md, 2026-12-06) 2.92 and 2.71 tokens a step on 16K and
    30K copy tasks against the full pass's 4.34 and 3.69 (K=4); with the fill
    it keeps 0.89-1.01x the full pass's and runs faster (``draft_pool_fill``).
    None: the draft's full pass over every prompt, as vLLM's (windowed by
    ``draft_prefill_window``). A number needs a draft model at its own
    positions under ``cmr`` (not with compacted positions,
    ``draft_prefill_window`` or ``self_draft``), at least ``top_k``; ``"auto"``
    steps aside for any of those (a ``draft_prefill_window`` named). Prompts
    shorter than ``pool_min_prompt`` pass in full."""

    draft_pool_fill: int | str | None = "auto"
    """With ``draft_prompt_pool``: chunks each refresh adds to a pooled
    prompt's draft KV (``drafting/pool_fill.py``). At every retrieval of a
    pooled request the ``N`` chunks the target ranks top among those without
    draft KV get it, in one draft forward over their tokens (reading the
    sinks and each other, in document order) before the step drafts, and the
    selection then chooses among all chunks with draft KV: the pooled pass's
    first token without its pool's fixed choice, which left out the chunks
    copy answers read later (the real-weights issue). Lossless (the target
    verifies every draft). ``"auto"`` (the default since 2026-12-07):
    ``AUTO_POOL_FILL`` (8) where a pool is made, else none
    (``config.resolve_pool_fill``); on the real pair (H100, K=12) the pool
    with a fill of 8 ran copy 30K 1.26x plain end to end against the full
    pass's 1.17-1.18x, batch 8 1.16x against 1.11-1.13x and copy 16K
    1.66-1.69x against 1.58-1.63x. A fill past the draft's largest CUDA graph
    is lowered to it. None: the pool stays as the prompt's end chose it."""

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

    lookup_tokens: int | str = "auto"
    """Draft, then look up (``drafting/lookup.py``): of the K tokens a step
    proposes, the draft model drafts the first ``K - lookup_tokens`` and the
    last ``lookup_tokens`` come from the request's own context: the tokens
    after the longest earlier match (3 to 8 tokens; then one with all its
    followers verified, then the latest) of the sequence's end (bonus token
    and drafts), as vLLM's prompt lookup finds them, with no draft forward. On
    copy tasks with the real Qwen2.5-Coder pair a step's four 0.5B forwards
    took 4.6 ms of 8.6 on an H100 while 4.3 of 5 tokens were accepted.
    Lossless (the target verifies every token). 0: off. Must be below
    ``num_speculative_tokens``; a step whose K vLLM lowered to
    ``lookup_tokens`` or less drafts all K. Greedy draft sampling only
    (vLLM's default ``draft_sample_method``: looked-up tokens have no draft
    probabilities). ``"auto"`` (``config.resolve_lookup``): K - 3 with a
    draft model at K of 8 or more where the engine allows it, else 0. Why: on
    the real pair (H100, 2026-12-06, docs/evaluation.md) K=8 with 5 looked up
    ran 1.49x plain end to end on 16K copy tasks and 1.17x on explain and
    summarise tasks, against 1.19x and 0.98x for K=4 without; K below 8 is
    not measured with the lookup, so stays off."""

    carry_drafts: int | None = None
    """Steps the lookup carries draft fewer tokens (``drafting/carry.py``):
    a uniform decode step drafts ``carry_drafts`` tokens through the draft
    model (the first forward writes the draft's KV of the verified tokens:
    at least 1) and looks up the rest of K where every row's last step known
    to the host (one or two steps late, no sync) accepted a looked-up token, and
    ``K - lookup_tokens`` otherwise. Why: while an answer copies its prompt
    the lookup's tokens hold 91-95% of the time once the first holds, so the
    draft's further forwards (~1 ms each for the real pair's 0.5B on an
    H100) repeat what the lookup proposes. Lossless (the target verifies
    every token). None: off. Needs the lookup on, and a count below
    ``K - lookup_tokens``; the captured routine keeps a graph for each
    count."""

    def __post_init__(self) -> None:
        check_values(self)

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
