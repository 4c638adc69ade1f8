"""What ``draft_pool_fill`` (``drafting/pool_fill.py``) needs of an engine,
and what it becomes on one.

Why its own file: a fill is one draft forward a request, bounded twice by
the engine: by the step's token budget (a refusal naming the fix) and by the
draft's largest CUDA graph (past it the forward runs eagerly, so the fill is
lowered to fit, logged at start). Pure functions; no vLLM import.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from vllm_specextend.config.keys import SpecExtendConfig
from vllm_specextend.config.values import SpecExtendConfigError

if TYPE_CHECKING:
    from vllm_specextend.config.engine import EngineFacts


def raise_if_bad_pool_fill(cfg: SpecExtendConfig, facts: EngineFacts) -> None:
    """``draft_pool_fill`` grows a prompt pool (``"auto"`` may resolve to
    none on an engine that cannot pool: the fill then has nothing to grow),
    a row's fill in one draft forward."""
    fill = cfg.draft_pool_fill
    if fill is None:
        return
    if cfg.draft_prompt_pool is None:
        raise SpecExtendConfigError(
            f"spec_extend.draft_pool_fill={fill} adds chunks to a "
            "prompt pool, but draft_prompt_pool is null. Set draft_prompt_pool "
            '(a number or "auto"), or leave draft_pool_fill unset.')
    budget = facts.max_num_batched_tokens
    if budget is not None and fill * cfg.chunk_size > budget:
        raise SpecExtendConfigError(
            f"spec_extend.draft_pool_fill={fill} fills {fill * cfg.chunk_size} tokens "
            f"a request in one draft forward, more than max_num_batched_tokens="
            f"{budget}. Lower draft_pool_fill, or raise --max-num-batched-tokens.")


def resolve_pool_fill(cfg: SpecExtendConfig,
                      facts: EngineFacts) -> tuple[SpecExtendConfig, str | None]:
    """``cfg`` with ``draft_pool_fill`` lowered to the chunks one draft CUDA
    graph holds, and a line for the start-up log; as it is, with None, where
    it fits, the draft is eager or no pool is made (``"auto"`` resolved to
    the full pass: nothing to grow). A fill of one row in one forward past the
    largest graph runs eagerly: on the real pair at K = 12 (graphs to 507
    tokens), 16 chunks (512 tokens) cost about 13 ms a fill more than 8
    (docs/evaluation.md, 2026-12-07)."""
    fill, graph = cfg.draft_pool_fill, facts.draft_graph_tokens
    if (fill is None or cfg.draft_prompt_pool is None or graph is None
            or fill * cfg.chunk_size <= graph):
        return cfg, None
    fitted = graph // cfg.chunk_size
    if fitted < 1:
        return cfg, None
    return (dataclasses.replace(cfg, draft_pool_fill=fitted),
            f"{fitted} chunks a fill, not {fill}: {fill * cfg.chunk_size} tokens "
            f"would pass the draft's largest CUDA graph ({graph} tokens at "
            f"K={facts.num_speculative_tokens}) and run eagerly")
