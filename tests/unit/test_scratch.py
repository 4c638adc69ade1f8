"""Scratch blocks and compacted views (no vLLM engine)."""

from __future__ import annotations

import types

import pytest
import torch

from vllm_specextend.drafting.rope import shift_keys
from vllm_specextend.drafting.scratch import copy_shifted, scratch_nbytes
from vllm_specextend.drafting.view import compacted_view, prefix_shift, view_blocks
from vllm_specextend.retrieval.scoring import gather_keys, page_keys, set_page_keys
from vllm_specextend.worker.mixin import SpecExtendWorkerMixin

H, BS, D = 2, 4, 8


def _cache(num_blocks=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_blocks, H, BS, 2 * D, generator=gen)


@pytest.mark.parametrize("ordered", [False, True])
def test_set_page_keys_is_the_inverse_of_page_keys(ordered):
    cache = _cache()
    key_order = torch.randperm(BS * D) if ordered else None
    blocks = torch.tensor([3, 7])
    pages = cache.index_select(0, blocks)
    before = pages.clone()
    keys = torch.randn(2, H, BS, D)
    set_page_keys(pages, keys, key_order)
    assert torch.equal(page_keys(pages, D, key_order), keys)
    # page_keys reads what gather_keys reads from the cache.
    assert torch.equal(page_keys(before, D, key_order),
                       gather_keys(cache, blocks, D, key_order))
    if not ordered:  # values (second half of each page) stay
        assert torch.equal(pages[..., D:], before[..., D:])
    else:  # every element outside the key positions stays
        kept = torch.ones(2 * BS * D, dtype=torch.bool)
        kept[key_order] = False
        flat, old = pages.view(2, H, -1), before.view(2, H, -1)
        assert torch.equal(flat[..., kept], old[..., kept])


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


def _spec(block_size, num_kv_heads, head_size, dtype):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size,
        dtype=dtype,
    )


def _draft(spec, num_layers, max_num_seqs, compact=True, **cfg):
    """A proposer with only what ``scratch_bytes`` reads: the config, the
    draft's attention layers (each with ``spec``) and max_num_seqs."""
    from vllm_specextend.config import SpecExtendConfig
    from vllm_specextend.drafting.compactor import Compactor
    from vllm_specextend.proposer import SpecExtendProposer

    names = {f"draft.layers.{i}.self_attn.attn" for i in range(num_layers)}
    layer = types.SimpleNamespace(get_kv_cache_spec=lambda vllm_config: spec)
    vllm_config = types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(
            static_forward_context=dict.fromkeys(names, layer)
        ),
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs),
    )
    proposer = object.__new__(SpecExtendProposer)  # no engine
    proposer.cfg = SpecExtendConfig(**cfg)
    proposer._draft_attn_layer_names = names
    proposer.compactor = (
        Compactor(proposer.cfg, vllm_config, torch.device("cpu"), draft_len=256)
        if compact
        else None
    )
    return proposer


def test_scratch_bytes_of_a_llama_1b_shaped_draft():
    # 16 layers, 8 KV heads of 64, bf16: 2 * 8 * 64 * 2 B = 2 KiB per token
    # and layer. Defaults: 32 sink + 64 chunks of 32 = 2080 tokens per request.
    spec = _spec(16, 8, 64, torch.bfloat16)
    assert _draft(spec, 16, 256).scratch_bytes() == 256 * 2080 * 16 * 2048 == int(16.25 * 2**30)
    # 32 sink + 32 chunks of 32 = 1056 tokens per request at top_k 32.
    proposer = _draft(spec, num_layers=16, max_num_seqs=256, top_k=32)
    assert proposer.scratch_bytes() == 256 * 1056 * 16 * 2048 == int(8.25 * 2**30)
    # The knobs the startup error names scale it.
    assert _draft(spec, 16, 128, top_k=32).scratch_bytes() == int(8.25 * 2**30) // 2
    assert _draft(spec, 16, 256, top_k=15).scratch_bytes() == 256 * 512 * 16 * 2048
    assert _draft(spec, 16, 256, compact=False).scratch_bytes() == 0


def test_scratch_nbytes_rounds_runs_up_to_whole_blocks():
    pages = [(512, 16), (1024, 32)]  # two layers, different blocks
    assert scratch_nbytes(pages, 32, 3) == 3 * (2 * 512 + 1 * 1024)
    assert scratch_nbytes(pages, 40, 3) == 3 * (3 * 512 + 2 * 1024)
    assert scratch_nbytes([], 40, 3) == 0


@pytest.mark.parametrize("kernel_bs", [BS, BS // 2])
def test_reservation_bounds_the_added_blocks(kernel_bs):
    """What the spec reserves covers what ``add_kv_blocks`` allocates in the CPU
    attention layout [blocks, H, bs, 2D], also with kernel blocks smaller than
    the scheduler's."""
    from vllm_specextend import compat

    tokens, runs = 3 * BS, 5
    spec = _spec(BS, H, D, torch.float32)
    reserved = scratch_nbytes([(spec.page_size_bytes, spec.block_size)], tokens, runs)
    old = torch.zeros(6, H, kernel_bs, 2 * D)
    layer = types.SimpleNamespace(kv_cache=old)
    runner = types.SimpleNamespace(kv_caches=[old])
    config = types.SimpleNamespace(
        compilation_config=types.SimpleNamespace(static_forward_context={"d": layer})
    )
    first = compat.add_kv_blocks(runner, config, ["d"], tokens // kernel_bs * runs)
    added = layer.kv_cache[first:]
    assert added.numel() * added.element_size() == reserved


class _Base:
    """Stands in for vLLM's worker: reports ``available`` as its KV budget,
    as the CPU worker returns kv_cache_memory_bytes unchanged."""

    available = 0

    def determine_available_memory(self):
        return self.available


class _Worker(SpecExtendWorkerMixin, _Base):
    pass


def _worker(available, scratch, one_request=None, monkeypatch=None):
    from vllm_specextend import compat
    from vllm_specextend.config import EngineFacts, SpecExtendConfig
    from vllm_specextend.serving.settings import Settings

    worker = _Worker()
    worker.available = available
    worker.settings = Settings.resolve(
        SpecExtendConfig(top_k=8),
        EngineFacts(has_speculative_config=True, method="draft_model", block_size=16,
                    tensor_parallel_size=1, pipeline_parallel_size=1),
    )
    drafter = types.SimpleNamespace(scratch_bytes=lambda: scratch)
    worker.model_runner = types.SimpleNamespace(drafter=drafter)
    worker.vllm_config = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_seqs=64)
    )
    monkeypatch.setattr(compat, "one_request_kv_bytes", lambda *_: one_request)
    return worker


def test_worker_takes_the_scratch_out_of_the_kv_budget(monkeypatch, caplog):
    worker = _worker(10 << 30, 3 << 30, one_request=1 << 30, monkeypatch=monkeypatch)
    with caplog.at_level("INFO", logger="vllm.plugins.specextend"):
        assert worker.determine_available_memory() == 7 << 30
    lines = [r.getMessage() for r in caplog.records if "scratch KV" in r.getMessage()]
    assert len(lines) == 1 and "3.00 GiB of the 10.00 GiB" in lines[0]
    assert "288 tokens per request x 64 requests" in lines[0]
    # Without compaction the budget is vLLM's.
    assert _worker(10 << 30, 0, monkeypatch=monkeypatch).determine_available_memory() \
        == 10 << 30


@pytest.mark.parametrize(
    "available, scratch, one_request",
    [
        (3 << 30, 3 << 30, None),  # nothing left for the KV cache
        (4 << 30, 3 << 30, 2 << 30),  # no room for one max_model_len request
    ],
)
def test_worker_refuses_a_budget_without_room_for_the_scratch(
    monkeypatch, available, scratch, one_request
):
    from vllm_specextend.config import SpecExtendConfigError

    worker = _worker(available, scratch, one_request, monkeypatch=monkeypatch)
    with pytest.raises(SpecExtendConfigError) as err:
        worker.determine_available_memory()
    message = str(err.value)
    for knob in ("max_num_seqs=64", "top_k=8", "chunk_size", "sink_tokens",
                 "gpu_memory_utilization", "kv_cache_memory_bytes"):
        assert knob in message
    assert ("one request of max_model_len" in message) == (one_request is not None)


def test_worker_allows_a_budget_that_just_fits(monkeypatch):
    worker = _worker(5 << 30, 3 << 30, one_request=2 << 30, monkeypatch=monkeypatch)
    assert worker.determine_available_memory() == 2 << 30
