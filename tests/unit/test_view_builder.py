"""ViewBuilder and Compactor: the batch view equals one built row by row, and
the batched scratch copies equal per-row copies (no vLLM)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.drafting.compactor import Compactor
from vllm_specextend.drafting.rope import shift_keys
from vllm_specextend.drafting.view import (
    ViewBuilder,
    build_view,
    compacted_view,
    prefix_shift,
)
from vllm_specextend.retrieval.scoring import gather_keys
from vllm_specextend.retrieval.staging import HostStaging
from vllm_specextend.retrieval.state import SelectionState
from vllm_specextend.serving.stats import SpecExtendStats

BS = 16
CFG = SpecExtendConfig(chunk_size=32, top_k=3, sink_tokens=32, recent_tokens=64,
                       min_context=0, draft_prefill_window=None)
CPU = torch.device("cpu")


def _batch(seed, num_reqs=6, width=40):
    """A state with random selections for some rows, and a block table."""
    rng = np.random.default_rng(seed)
    state = SelectionState(8, CFG.top_k, CPU)
    ids = [f"r{i}" for i in range(num_reqs)]
    slots, slots_dev = state.slots_for(ids)
    seq = rng.integers(200, width * BS - 8, size=num_reqs)
    drafting = rng.random(num_reqs) < 0.8
    per_chunk = CFG.chunk_size // BS
    for r in range(num_reqs):
        if rng.random() < 0.25:
            continue  # no selection
        start = int(rng.integers(3, seq[r] // CFG.chunk_size)) * CFG.chunk_size
        candidates = start // CFG.chunk_size - 1
        n = min(CFG.top_k, candidates)
        chunks = np.sort(rng.choice(np.arange(1, start // CFG.chunk_size), n,
                                    replace=False))
        padded = torch.zeros(1, CFG.top_k, dtype=torch.int32)
        padded[0, :n] = torch.from_numpy(chunks)
        state.put(slots[r : r + 1], np.array([start]), np.array([n]), padded,
                  slots_dev[r : r + 1])
    gen = torch.Generator().manual_seed(seed)
    table = torch.randperm(num_reqs * width + 50, generator=gen)[: num_reqs * width]
    table = table.view(num_reqs, width).to(torch.int32) + 7
    assert per_chunk == 2
    return state, ids, slots, slots_dev, seq, drafting, table


def _row_view(state, req_id, row_table):
    """One row's view as the module docstring defines it."""
    start, chunks, _ = state.selection(req_id)
    sink_blocks, per_chunk = CFG.sink_tokens // BS, CFG.chunk_size // BS
    view, logical = build_view(
        row_table[None],
        sink_blocks,
        torch.tensor([len(chunks)]),
        torch.tensor([start // BS]),
        torch.tensor([chunks + [0] * (CFG.top_k - len(chunks))], dtype=torch.int32),
        per_chunk,
    )
    offset = start - (sink_blocks + len(chunks) * per_chunk) * BS
    return view[0], logical[0], offset


@pytest.mark.parametrize("seed", range(5))
def test_batch_view_equals_rows(seed):
    state, ids, slots, slots_dev, seq, drafting, table = _batch(seed)
    stats = SpecExtendStats()
    view = ViewBuilder(CFG, state, HostStaging(CPU), BS).build(
        seq, drafting, slots, slots_dev, table, stats
    )
    assert view is not None
    used = 0
    for r, req_id in enumerate(ids):
        on = drafting[r] and state.selection(req_id) is not None
        if not on:
            assert view.offsets[r] == 0 and view.offsets_cpu[r] == 0
            assert torch.equal(view.block_table[r], table[r]), "full table"
            continue
        used += 1
        row, _, offset = _row_view(state, req_id, table[r])
        length = seq[r] - offset
        n_blocks = -(-length // BS)
        assert int(view.offsets[r]) == offset == int(view.offsets_cpu[r])
        assert torch.equal(view.block_table[r, :n_blocks], row[:n_blocks])
        assert state.selection(req_id)[2] == 1, "counted as drafted once"
    assert stats.view_rows == used
    assert stats.decode_rows == int(drafting.sum())
    assert stats.full_context_tokens == int(seq[drafting].sum())
    assert view.offsets.dtype == torch.int32


def test_no_view_when_no_row_uses_one():
    state, ids, slots, slots_dev, seq, _, table = _batch(0)
    stats = SpecExtendStats()
    builder = ViewBuilder(CFG, state, HostStaging(CPU), BS)
    assert builder.build(seq, np.zeros(len(ids), bool), slots, slots_dev, table,
                         stats) is None
    assert stats.view_rows == 0


def test_chunk_must_be_whole_blocks():
    with pytest.raises(ValueError, match="multiple"):
        ViewBuilder(CFG, None, None, block_size=24)


def _compactor(num_blocks, seed):
    gen = torch.Generator().manual_seed(seed)
    compactor = object.__new__(Compactor)  # no engine: only the copy logic
    compactor.cfg = CFG
    compactor.device = CPU
    compactor.blocks_per_request = CFG.draft_budget_tokens // BS
    compactor.first_block = num_blocks
    extra = 8 * compactor.blocks_per_request
    compactor._draft_kv = [torch.randn(num_blocks + extra, 2, BS, 16, generator=gen)
                           for _ in range(2)]
    compactor._key_orders = [None, torch.randperm(BS * 8, generator=gen)]
    compactor._head_size = 8
    compactor._inv_freq = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
    compactor._is_neox = True
    return compactor


@pytest.mark.parametrize("seed", range(3))
def test_compaction_equals_per_row_copies(seed):
    state, ids, slots, slots_dev, seq, drafting, table = _batch(seed)
    num_blocks = int(table.max()) + 1
    compactor = _compactor(num_blocks, seed)
    before = [kv.clone() for kv in compactor._draft_kv]
    stats = SpecExtendStats()
    builder = ViewBuilder(CFG, state, HostStaging(CPU), BS, compactor)
    view = builder.build(seq, drafting, slots, slots_dev, table, stats)
    copied = 0
    for r, req_id in enumerate(ids):
        if not (drafting[r] and state.selection(req_id) is not None):
            assert torch.equal(view.block_table[r], table[r])
            continue
        row, logical, offset = _row_view(state, req_id, table[r])
        prefix = CFG.sink_tokens // BS + len(state.selection(req_id)[1]) * 2
        first = num_blocks + slots[r] * compactor.blocks_per_request
        want = compacted_view(row[None], torch.tensor([first]), torch.tensor([prefix]))
        n_blocks = -(-(seq[r] - offset) // BS)
        assert torch.equal(view.block_table[r, :n_blocks], want[0, :n_blocks])
        src = row[:prefix].long()
        dst = torch.arange(first, first + prefix)
        delta = prefix_shift(logical[:prefix], offset, BS)
        for kv, old, order in zip(compactor._draft_kv, before, compactor._key_orders):
            expect = shift_keys(gather_keys(old, src, 8, order), delta,
                                compactor._inv_freq, True)
            torch.testing.assert_close(gather_keys(kv, dst, 8, order), expect)
        assert state.compacted[slots[r]]
        copied += 1
    assert stats.compactions == copied > 0
    # The pool itself is never written.
    for kv, old in zip(compactor._draft_kv, before):
        assert torch.equal(kv[:num_blocks], old[:num_blocks])
    # A second step with the same selections copies nothing more.
    snapshot = [kv.clone() for kv in compactor._draft_kv]
    builder.build(seq, drafting, slots, slots_dev, table, stats)
    assert stats.compactions == copied
    assert all(torch.equal(a, b) for a, b in zip(snapshot, compactor._draft_kv))


@pytest.mark.parametrize("seed", range(3))
def test_prompt_chunks_read_sinks_and_their_window(seed):
    """``draft_prefill_window``: a prompt-chunk row reads the sinks, then whole
    blocks from ``q_start - window`` to its end (its chunk's queries stay the
    row's last tokens); chunks near the start keep the full table, and the
    decoding rows' views are the ones they had without the window."""
    window = 100
    cfg = SpecExtendConfig(**{**CFG.to_dict(), "draft_prefill_window": window})
    state, ids, slots, slots_dev, seq, drafting, table = _batch(seed)
    rng = np.random.default_rng(seed)
    drafting[:3] = False  # prompt chunks, the first with its window in the sinks
    q_start = np.where(drafting, seq - 3, seq - rng.integers(1, 160, size=len(seq)))
    q_start[0] = 40
    stats, plain_stats = SpecExtendStats(), SpecExtendStats()
    view = ViewBuilder(cfg, state, HostStaging(CPU), BS).build(
        seq, drafting, slots, slots_dev, table, stats, q_start)
    state.steps_since_refresh[:] = 0
    plain = ViewBuilder(CFG, state, HostStaging(CPU), BS).build(
        seq, drafting, slots, slots_dev, table, plain_stats, q_start)
    sinks = CFG.sink_tokens // BS
    windowed = 0
    for r in range(len(ids)):
        if drafting[r]:
            assert int(view.offsets[r]) == (0 if plain is None else int(plain.offsets[r]))
            continue
        first = (q_start[r] - window) // BS
        if first <= sinks:
            assert view.offsets[r] == 0 and torch.equal(view.block_table[r], table[r])
            continue
        windowed += 1
        offset = (first - sinks) * BS
        assert int(view.offsets[r]) == offset == int(view.offsets_cpu[r])
        n_blocks = -(-(seq[r] - offset) // BS)
        want = torch.cat([table[r, :sinks], table[r, first:]])[:n_blocks]
        assert torch.equal(view.block_table[r, :n_blocks], want)
        # The window covers at least `window` tokens before the chunk.
        assert first * BS <= q_start[r] - window
    assert windowed > 0 and stats.prefill_window_rows == windowed
    assert stats.decode_rows == plain_stats.decode_rows
    assert stats.view_rows == plain_stats.view_rows, "chunk rows are no view rows"


def test_no_prompt_windows_without_the_key():
    state, ids, slots, slots_dev, seq, _, table = _batch(0)
    stats = SpecExtendStats()
    none = np.zeros(len(ids), bool)
    builder = ViewBuilder(CFG, state, HostStaging(CPU), BS)
    assert builder.build(seq, none, slots, slots_dev, table, stats, seq - 100) is None
    assert stats.prefill_window_rows == 0
