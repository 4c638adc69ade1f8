"""What ``draft_pool_fill`` (``drafting/pool_fill.py``) needs of an engine,
and what it becomes on one.

Why its own file: a fill is one draft forward a request, bounded twice by
the engine: by the step's token budget (a refusal naming the fix) and by the
draft's largest CUDA graph (past it the forward runs eagerly, so the fill is
lowered to fit, logged at start). ``"auto"`` (the default) is
``AUTO_POOL_FILL`` chunks where the engine pools a prompt, else none. Pure
functions; no vLLM import.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from vllm_specextend.config.keys import SpecExtendConfig
from vllm_specextend.config.values import SpecExtendConfigError

if TYPE_CHECKING:
    from vllm_specextend.config.engine import EngineFacts


AUTO_POOL_FILL = 8
"""``draft_pool_fill: "auto"``: chunks a refresh adds, measured on the real
pair (H100, 2026-12-07, ``benchmarks/results/realpair/20261207T0834Z_h100_fill2``,
K=12, 16 prompts a cell): with ``draft_prompt_pool: "auto"`` end to end 1.26x
plain on copy 30K against the full pass's 1.17-1.18x, 1.16x at batch 8
against 1.11-1.13x, 1.66-1.69x on copy 16K against 1.58-1.63x; accepted
length 0.89-1.01x the full pass's. 15 (the most one graph held at K=12) was
as fast at 30K and batch 8 and slower at 16K (1.51-1.60x)."""


def raise_if_bad_pool_fill(cfg: SpecExtendConfig, facts: EngineFacts) -> None:
    """``draft_pool_fill`` grows a prompt pool (``"auto"`` may resolve to
    none on an engine that cannot pool: the fill then has nothing to grow),
    a row's fill in one draft forward."""
    fill = cfg.draft_pool_fill
    if fill in (None, "auto"):  # "auto" steps aside where no pool is made
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
    """``cfg`` with ``draft_pool_fill`` resolved for this engine (after
    ``resolve_prompt_pool``), and a line for the start-up log (None where
    there is nothing to say). ``"auto"`` becomes ``AUTO_POOL_FILL`` within
    the step's token budget; where no pool is made (``draft_prompt_pool``
    ``"auto"`` resolved to the full pass) any fill becomes None: nothing to
    grow. A fill is then lowered to the chunks one draft CUDA graph holds
    (left as it is where the draft is eager): a fill of one row in one
    forward past the largest graph runs eagerly, and on the real pair at
    K = 12 (graphs to 507 tokens) 16 chunks (512 tokens) cost about 13 ms a
    fill more than 8 (docs/evaluation.md, 2026-12-07)."""
    auto = cfg.draft_pool_fill == "auto"
    if auto:
        fill = AUTO_POOL_FILL
        budget = facts.max_num_batched_tokens
        if budget is not None:
            fill = min(fill, budget // cfg.chunk_size)
        cfg = dataclasses.replace(cfg, draft_pool_fill=fill if fill >= 1 else None)
    if cfg.draft_prompt_pool is None and cfg.draft_pool_fill is not None:
        # No pool made ("auto" resolved to the full pass): nothing to grow.
        note = None if auto else (f"none, not {cfg.draft_pool_fill}: no prompt "
                                  "pool is made on this engine")
        return dataclasses.replace(cfg, draft_pool_fill=None), note
    fill, graph = cfg.draft_pool_fill, facts.draft_graph_tokens
    if fill is None or graph is None or fill * cfg.chunk_size <= graph:
        return cfg, (f"{fill} chunks a refresh" if auto and fill else None)
    fitted = graph // cfg.chunk_size
    if fitted < 1:
        return cfg, None
    return (dataclasses.replace(cfg, draft_pool_fill=fitted),
            f"{fitted} chunks a fill, not {fill}: {fill * cfg.chunk_size} tokens "
            f"would pass the draft's largest CUDA graph ({graph} tokens at "
            f"K={facts.num_speculative_tokens}) and run eagerly")
