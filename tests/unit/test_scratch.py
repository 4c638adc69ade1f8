"""Scratch blocks and compacted views (no vLLM engine)."""

from __future__ import annotations

import types

import pytest
import torch

from vllm_specextend.rope import shift_keys
from vllm_specextend.scoring import gather_keys, scatter_keys
from vllm_specextend.scratch import ScratchBlocks, copy_shifted
from vllm_specextend.view import compacted_view, prefix_shift, view_blocks

H, BS, D = 2, 4, 8


def _cache(num_blocks=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_blocks, H, BS, 2 * D, generator=gen)


@pytest.mark.parametrize("ordered", [False, True])
def test_scatter_is_the_inverse_of_gather(ordered):
    cache = _cache()
    key_order = torch.randperm(BS * D) if ordered else None
    blocks = torch.tensor([3, 7])
    keys = torch.randn(2, H, BS, D)
    before = cache.clone()
    scatter_keys(cache, blocks, keys, key_order)
    assert torch.equal(gather_keys(cache, blocks, D, key_order), keys)
    untouched = torch.ones(cache.shape[0], dtype=torch.bool)
    untouched[blocks] = False
    assert torch.equal(cache[untouched], before[untouched])
    if not ordered:  # values (second half of each page) stay
        assert torch.equal(cache[blocks][..., D:], before[blocks][..., D:])


@pytest.mark.parametrize("ordered", [False, True])
def test_copy_shifted(ordered):
    caches = [_cache(seed=0), _cache(seed=1)]
    orders = [torch.randperm(BS * D) if ordered else None] * 2
    before = [c.clone() for c in caches]
    inv_freq = 1.0 / 10000 ** (torch.arange(0, D, 2).float() / D)
    src, dst, delta = torch.tensor([1, 4]), torch.tensor([10, 11]), torch.tensor([5, 40])
    copy_shifted(caches, orders, src, dst, delta, inv_freq, True, D)
    for cache, old, order in zip(caches, before, orders):
        want = shift_keys(gather_keys(old, src, D, order), delta, inv_freq, True)
        torch.testing.assert_close(gather_keys(cache, dst, D, order), want)
        assert torch.equal(cache[:10], old[:10]), "sources and the pool stay"
        if not ordered:
            assert torch.equal(cache[dst][..., D:], old[src][..., D:])


def test_scratch_runs_are_per_request_and_recycled():
    scratch = ScratchBlocks(first_block=100, blocks_per_request=3, num_runs=2)
    a, b = scratch.run_of("a"), scratch.run_of("b")
    assert {a, b} == {100, 103} and scratch.run_of("a") == a
    with pytest.raises(RuntimeError, match="scratch runs"):
        scratch.run_of("c")
    scratch.release(["a", "unknown"])
    assert scratch.run_of("c") == a and len(scratch) == 2
    scratch.sweep(["c"])
    assert len(scratch) == 1 and scratch.run_of("d") == b


def test_compacted_view_and_prefix_shift():
    # bs=4, one sink block, chunks of 2 blocks; row 0 keeps chunks 3 and 7 and
    # a window from block 20; row 1 has no view.
    table = torch.arange(1000, 1048, dtype=torch.int32).view(2, 24)
    logical = view_blocks(
        table.shape, 1, torch.tensor([2, 0]), torch.tensor([20, 1]),
        torch.tensor([[3, 7], [0, 0]], dtype=torch.int32), 2,
    )
    view = torch.gather(table, 1, logical)
    prefix = torch.tensor([5, 1])
    out = compacted_view(view, torch.tensor([500, -1]), prefix)
    assert out.dtype == table.dtype
    assert out[0, :5].tolist() == [500, 501, 502, 503, 504]
    assert torch.equal(out[0, 5:], view[0, 5:]) and torch.equal(out[1], table[1])
    # Window at token 80, 5 prefix blocks of 4 tokens: offset 60.
    shift = prefix_shift(logical[0, :5], 60, 4)
    new_first_token = 60 + 4 * torch.arange(5)
    assert torch.equal(logical[0, :5] * 4 + shift, new_first_token)
    assert shift.tolist() == [60, 40, 40, 16, 16] and (shift >= 0).all()


@pytest.mark.parametrize("permuted", [False, True])
def test_add_kv_blocks_keeps_layout_and_rebinds(permuted):
    from vllm_specextend import compat

    # Logical [blocks, H, bs, 2D]; physically blocks-first or heads-first.
    old = torch.randn(H, 6, BS, 2 * D).permute(1, 0, 2, 3) if permuted else _cache(6)
    other = torch.zeros(1)
    layer = types.SimpleNamespace(kv_cache=old)
    runner = types.SimpleNamespace(kv_caches=[other, old])
    config = types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(static_forward_context={"d": layer})
    )
    first = compat.add_kv_blocks(runner, config, ["d"], 4)
    new = layer.kv_cache
    assert first == old.shape[0] and new.shape[0] == old.shape[0] + 4
    assert torch.equal(new[:first], old)
    order = lambda t: sorted(range(t.dim()), key=lambda d: -t.stride(d))  # noqa: E731
    assert order(new) == order(old)
    assert runner.kv_caches[0] is other and runner.kv_caches[1] is new
