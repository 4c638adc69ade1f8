"""Async scheduling by default under ``--spec-extend``.

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
"""

from __future__ import annotations

from vllm_specextend import compat
from vllm_specextend.config import ADDITIONAL_CONFIG_KEY


def async_by_default(args) -> bool:
    """Before vLLM resolves ``args`` (its ``EngineArgs``): ask for async
    scheduling where the user left it unset. Returns whether it did."""
    if ADDITIONAL_CONFIG_KEY not in (args.additional_config or {}):
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
