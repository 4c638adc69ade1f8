"""vLLM's tensor-parallel group: rank, all-reduce and broadcast.

With tensor parallelism each rank holds a slice of the heads, so chunk scores
are reduced over the group and the chosen chunks broadcast from its first
rank: every rank must draft from the same view.
"""

from __future__ import annotations

import torch


def tp_rank_and_size() -> tuple[int, int]:
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def tp_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over the TP group (a new tensor of the same shape)."""
    from vllm.distributed import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(tensor)


def tp_broadcast(tensor: torch.Tensor) -> torch.Tensor:
    """From the TP group's first rank to the others (in place)."""
    from vllm.distributed import get_tp_group

    return get_tp_group().broadcast(tensor, src=0)
