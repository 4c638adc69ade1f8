"""vLLM's paged KV cache: layout, sizes and the draft's scratch blocks.

Attention backends put the block dimension first in the logical shape of a
layer's KV tensor (CPU: ``[num_blocks, num_kv_heads, block_size, 2 *
head_size]``); the order of keys inside a CPU page depends on the ISA and is
learnt from the layer's own cache-update kernel.
"""

from __future__ import annotations

import torch

from vllm_specextend.compat.layers import attention_layer
from vllm_specextend.compat.patches import DRAFT_KV_CACHE, REGISTRY, RUNNER_KV_CACHES

# vLLM 0.26: slot id that attention's KV update skips (spec_decode.utils).
PADDING_SLOT_ID = -1


def layer_kv_cache(layer) -> torch.Tensor:
    """The layer's KV tensor, block dimension first."""
    kv_cache = layer.kv_cache
    # vLLM 0.26 binds one tensor per layer; older releases a list per engine.
    return kv_cache[0] if isinstance(kv_cache, list) else kv_cache


def cpu_key_order(layer, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Page offset of key element (t, d) in a CPU attention KV page:
    ``[block_size * head_size]`` int64, a permutation.

    vLLM 0.26: CPU attention stores each (block, head) page's keys in an order
    that depends on the ISA (``vec``: [D, bs] transposed). Write known keys
    through the layer's own cache-update kernel and read back where they went.
    Values are split into two small integers so that bf16 stays exact.
    """
    impl = layer.impl
    head_size = layer.head_size
    num_elems = block_size * head_size
    ids = torch.arange(num_elems).view(1, block_size, 1, head_size)
    parts = []
    for digit in (ids % 128, ids // 128):
        # [1 block, 1 head, block_size, keys then values]
        cache = torch.zeros(1, 1, block_size, 2 * head_size, dtype=dtype)
        key = digit.view(block_size, 1, head_size).to(dtype)  # [tokens, 1, D]
        impl.do_kv_cache_update(
            layer, key, torch.zeros_like(key), cache, torch.arange(block_size)
        )
        parts.append(cache.view(-1)[:num_elems].to(torch.int64))
    where = parts[0] + 128 * parts[1]  # [num_elems]: key element at each offset
    order = torch.empty(num_elems, dtype=torch.int64)
    order[where] = torch.arange(num_elems)
    _raise_if_not_permutation(where, num_elems)
    return order


def _raise_if_not_permutation(where: torch.Tensor, num_elems: int) -> None:
    if not torch.equal(torch.sort(where).values, torch.arange(num_elems)):
        raise RuntimeError("CPU KV page is not a permutation of the keys.")


def kv_block_bytes(vllm_config, layer_names) -> list[tuple[int, int]]:
    """(bytes, tokens) of one KV block of each named layer, as vLLM budgets it.

    vLLM 0.26: a layer's ``get_kv_cache_spec`` is what the runner collects
    for sizing the pool; it works once the model is loaded, before the KV cache
    exists.
    """
    pages = []
    for name in layer_names:
        spec = attention_layer(vllm_config, name).get_kv_cache_spec(vllm_config)
        pages.append((spec.page_size_bytes, spec.block_size))
    return pages


def one_request_kv_bytes(runner, vllm_config) -> int | None:
    """KV bytes vLLM requires for one request of max_model_len, None when it
    fits max_model_len to the memory instead (``--max-model-len -1``).

    vLLM 0.26: ``check_enough_kv_cache_memory`` raises below this, with a
    message that only names gpu_memory_utilization and max_model_len.
    """
    from vllm.v1.core.kv_cache_utils import max_memory_usage_bytes

    if vllm_config.model_config.original_max_model_len == -1:
        return None
    return max_memory_usage_bytes(vllm_config, runner.get_kv_cache_spec().values())


def add_kv_blocks(runner, vllm_config, layer_names, num_extra: int) -> int:
    """Give each named attention layer ``num_extra`` KV blocks past the pool.

    Allocates a larger tensor with the same physical layout (stride order) and
    rebinds the layer and the runner's list entry to it (the declared patches
    ``DRAFT_KV_CACHE`` and ``RUNNER_KV_CACHES``); the scheduler never hands out
    the extra block ids. Layer by layer, so at most one old tensor is alive
    beside the new ones. Must run before CUDA-graph capture, which bakes in
    tensor addresses. Returns the first extra block id.

    vLLM 0.26: ``bind_kv_cache`` sets ``layer.kv_cache`` (static forward
    context) and appends to ``runner.kv_caches``; all attention backends put
    the block dimension first in the logical shape.
    """
    layers = [attention_layer(vllm_config, name) for name in layer_names]
    _raise_if_no_layers(layers)
    first = layer_kv_cache(layers[0]).shape[0]
    # The runner's list is replaced by one we own; its draft entries follow.
    REGISTRY.apply(RUNNER_KV_CACHES, runner)
    for layer in layers:
        old = layer_kv_cache(layer)  # [num_blocks, ...]
        _raise_if_block_count_differs(old, first)
        new = _with_more_blocks(old, num_extra)  # [num_blocks + num_extra, ...]
        REGISTRY.apply(DRAFT_KV_CACHE, layer, new)
        runner.kv_caches[:] = [new if t is old else t for t in runner.kv_caches]
    return first


def _with_more_blocks(old: torch.Tensor, num_extra: int) -> torch.Tensor:
    """``old`` grown by ``num_extra`` zero blocks, same stride order."""
    order = sorted(range(old.dim()), key=lambda d: -old.stride(d))
    shape = list(old.shape)
    shape[0] += num_extra
    new = torch.zeros(
        [shape[d] for d in order], dtype=old.dtype, device=old.device
    ).permute(*[order.index(d) for d in range(old.dim())])
    new[: old.shape[0]].copy_(old)
    return new


def _raise_if_no_layers(layers: list) -> None:
    if not layers:
        raise RuntimeError("vllm-specextend found no draft attention layer.")


def _raise_if_block_count_differs(kv_cache: torch.Tensor, num_blocks: int) -> None:
    if kv_cache.shape[0] != num_blocks:
        raise RuntimeError("vllm-specextend: draft layers differ in block count.")
