"""vLLM's tensor-parallel group: rank, all-reduce, broadcast, graph capture.

With tensor parallelism each rank holds a slice of the heads, so chunk scores
are reduced over the group and the chosen chunks broadcast from its first
rank: every rank must draft from the same view. A draft routine captured at
TP records the draft's collectives in its graph, inside vLLM's own capture
context (``capture_stream``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

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


@contextmanager
def capture_stream(device: torch.device) -> Iterator[torch.cuda.Stream]:
    """vLLM's graph-capture context, yielding the stream to capture on.

    vLLM 0.26: ``parallel_state.graph_capture`` is what the runner's own
    capture runs in. Inside it the custom all-reduce records its
    registered-buffer kernel (``CustomAllreduce.capture``) and, on exit,
    exchanges the graph's buffer addresses with the other ranks
    (``register_graph_buffers``): every rank must capture the same collectives
    in the same order, as the draft routine does (same sizes, same body).
    Without TP it only provides a side stream.
    """
    from vllm.distributed.parallel_state import graph_capture

    with graph_capture(device=device) as context:
        yield context.stream
