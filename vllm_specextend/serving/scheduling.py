"""Async scheduling by default under ``--spec-extend``, and a step's token
budget as without speculation.

vLLM 0.26 leaves async scheduling off for draft-model speculation unless asked
for (``VllmConfig``: "Async scheduling not supported with draft_model-based
speculative decoding"), but accepts it when asked, and then overlaps the next
step's scheduling and input preparation with this step's drafting. The plugin
drafts only from device tensors and plans from host lengths that are upper
bounds under async scheduling (``planner``, ``draft_graph.blocker``), so it
asks for it: on one H100 at 32K and batch 1 the eager draft path ran 145
instead of 127 tok/s with it (``../shared/docs/draft-graphs.md``).
``--no-async-scheduling`` keeps it off. Under Ray it holds for vLLM's v2
executor (its default), not for the v1 one.

vLLM also takes a draft model's slot for every possible request out of its
default step budget (``max_num_scheduled_tokens = max_num_batched_tokens -
max_num_seqs``: 15,360 of 16,384 for ``LLM`` on an H100), so a 16,341-token
prompt that plain decoding computes in one step takes two, and the first
token waits for the second. With the real pair at batch 8 the first of eight
16K prompts came at 0.49 s against plain's 0.17 s (2026-12-06). Where the
user set no budget, ``plain_step_budget`` keeps vLLM's default as the step's
budget and adds the slots on top (what vLLM's warning advises).
"""

from __future__ import annotations

from vllm_specextend import compat
from vllm_specextend.config import ADDITIONAL_CONFIG_KEY


def async_by_default(args) -> bool:
    """Before vLLM resolves ``args`` (its ``EngineArgs``): ask for async
    scheduling where the user left it unset. Returns whether it did."""
    if not _spec_extend_on(args):
        return False
    if args.async_scheduling is not None or compat.is_cpu_platform():
        return False  # the user's choice; vLLM's CPU platform has none
    if not compat.executor_supports_async(args.distributed_executor_backend):
        return False  # vLLM would refuse it
    args.async_scheduling = True
    compat.logger.info(
        "SpecExtend: async scheduling on (vLLM leaves it off for draft models; "
        "--no-async-scheduling turns it off)."
    )
    return True


def plain_step_budget(args, defaults) -> bool:
    """After vLLM set its default ``max_num_batched_tokens`` on ``args`` (its
    ``EngineArgs``; ``defaults`` a ``compat.BatchDefaults``): a step schedules
    that many tokens, as without speculation, and the draft's slots per
    request go on top. Nothing where the user set a budget, no draft adds
    slots, the default already holds every sequence at full length (vLLM caps
    it there and would warn past it), or the budget is a batched
    data-parallel MoE's dispatch size. Returns whether it changed ``args``."""
    if not _spec_extend_on(args):
        return False
    if defaults.user_budget or defaults.draft_slots <= 0 or defaults.batched_dp_moe:
        return False
    budget = args.max_num_batched_tokens
    total = budget + defaults.draft_slots * args.max_num_seqs
    if total > args.max_num_seqs * defaults.max_model_len:
        return False
    args.max_num_scheduled_tokens = budget
    args.max_num_batched_tokens = total
    compat.logger.info(
        "SpecExtend: a step schedules %d tokens, as without speculation; "
        "max_num_batched_tokens %d holds the draft's %d slot(s) for each of %d "
        "sequences (--max-num-batched-tokens sets the budget instead).",
        budget, total, defaults.draft_slots, args.max_num_seqs,
    )
    return True


def _spec_extend_on(args) -> bool:
    return ADDITIONAL_CONFIG_KEY in (args.additional_config or {})
