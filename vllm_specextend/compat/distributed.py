"""vLLM's tensor-parallel group: rank, all-reduce, broadcast, graph capture.

With tensor parallelism each rank holds a slice of the heads, so chunk scores
are reduced over the group and the chosen chunks broadcast from its first
rank: every rank must draft from the same view. A draft routine captured at
TP records the draft's collectives in its graph, inside vLLM's own capture
context (``capture_stream``).

A replicated draft (``replicated.py``) is built and run against a one-rank
group that stands in for the TP group (``draft_tp_group``); the plugin's own
collectives keep the target's group (``_target_group``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


_target_tp = None
"""The target's TP group while a draft's one-rank group stands in for it."""


def _target_group():
    from vllm.distributed import get_tp_group

    return _target_tp if _target_tp is not None else get_tp_group()


def tp_rank_and_size() -> tuple[int, int]:
    """This rank and the size of the target's TP group."""
    group = _target_group()
    return group.rank_in_group, group.world_size


def tp_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over the target's TP group (a new tensor of the same shape)."""
    return _target_group().all_reduce(tensor)


def tp_broadcast(tensor: torch.Tensor) -> torch.Tensor:
    """From the target's TP group's first rank to the others (in place)."""
    return _target_group().broadcast(tensor, src=0)


def one_rank_tp_group():
    """A TP group of this rank alone, for a draft whole on every rank.

    vLLM 0.26: ``GroupCoordinator`` makes one torch.distributed group per
    rank list, and every rank of the world must create every list's group,
    so each rank calls this at the same point (the draft's load). A group of
    one needs no device communicator: its collectives return their input.
    """
    from vllm.distributed import get_tp_group
    from vllm.distributed.parallel_state import (
        get_world_group,
        init_model_parallel_group,
    )

    world, tp = get_world_group(), get_tp_group()
    return init_model_parallel_group(
        [[rank] for rank in range(world.world_size)],
        world.local_rank,
        tp.torch_distributed_backend,
        use_device_communicator=False,
        group_name="specextend_draft",
    )


@contextmanager
def draft_tp_group(group) -> Iterator[None]:
    """``group`` as vLLM's TP group inside the block (``DRAFT_TP_GROUP``).

    A draft built and run inside it is whole on each rank; the plugin's own
    collectives (``tp_all_reduce``, ``tp_broadcast``) keep the target's group.
    Nested blocks keep the outer one's state; ``group`` None changes nothing.
    """
    global _target_tp
    from vllm.distributed import parallel_state

    from vllm_specextend.compat.patches import DRAFT_TP_GROUP, REGISTRY

    if group is None or _target_tp is not None:
        yield
        return
    target = parallel_state._TP
    REGISTRY.apply(DRAFT_TP_GROUP, parallel_state, group)
    _target_tp = target
    try:
        yield
    finally:
        _target_tp = None
        REGISTRY.undo(DRAFT_TP_GROUP, parallel_state)


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
