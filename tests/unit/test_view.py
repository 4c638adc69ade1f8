"""Block-table view: exact tables, offsets and token-level semantics (no vLLM)."""

from __future__ import annotations

import random

import pytest
import torch

from vllm_specextend.drafting.view import build_view, view_offsets


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _table(rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """Distinct physical ids per row (a random permutation of a big pool)."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.randperm(rows * width + 100, generator=gen)[: rows * width]
    return (pool.view(rows, width) + 1000).to(torch.int32)


def _i(*xs):
    return torch.tensor(xs, dtype=torch.int64)


# --- hand-made tables -------------------------------------------------------------


def test_selected_chunks_and_window_exact():
    # bs=4 tokens per block, chunk = 2 blocks, one sink block.
    width = 24
    bt = _table(1, width)
    view, _ = build_view(
        bt,
        sink_blocks=1,
        num_selected=_i(2),
        window_block=_i(20),
        selected_chunks=torch.tensor([[3, 7]], dtype=torch.int32),
        blocks_per_chunk=2,
    )
    real = bt[0].tolist()
    expected = [real[0], real[6], real[7], real[14], real[15]] + real[20:24]
    assert view.shape == bt.shape
    assert view.dtype == bt.dtype
    assert view[0, : len(expected)].tolist() == expected


def test_identity_when_nothing_dropped():
    bt = _table(3, 10, seed=1)
    view, _ = build_view(
        bt,
        sink_blocks=2,
        num_selected=_i(0, 0, 0),
        window_block=_i(2, 2, 2),
        selected_chunks=torch.zeros(3, 4, dtype=torch.int32),
        blocks_per_chunk=2,
    )
    assert torch.equal(view, bt)


def test_identity_with_no_selected_column():
    bt = _table(2, 7, seed=2)
    view, _ = build_view(
        bt,
        sink_blocks=1,
        num_selected=_i(0, 0),
        window_block=_i(1, 1),
        selected_chunks=torch.zeros(2, 0, dtype=torch.int32),
        blocks_per_chunk=3,
    )
    assert torch.equal(view, bt)


def test_streaming_row():
    bt = _table(1, 16, seed=3)
    view, _ = build_view(
        bt,
        sink_blocks=2,
        num_selected=_i(0),
        window_block=_i(10),
        selected_chunks=torch.zeros(1, 0, dtype=torch.int32),
        blocks_per_chunk=2,
    )
    real = bt[0].tolist()
    expected = real[0:2] + real[10:16]
    assert view[0, : len(expected)].tolist() == expected


def test_multiple_rows_padded_selection():
    width = 20
    bt = _table(3, width, seed=4)
    # sink_blocks=2, blocks_per_chunk=2 (sinks = chunk 0).
    selected = torch.tensor(
        [
            [1, 4, 6],  # 3 valid
            [2, 0, 0],  # 1 valid, padded
            [0, 0, 0],  # none (streaming-style)
        ],
        dtype=torch.int32,
    )
    view, _ = build_view(
        bt,
        sink_blocks=2,
        num_selected=_i(3, 1, 0),
        window_block=_i(16, 8, 12),
        selected_chunks=selected,
        blocks_per_chunk=2,
    )
    r0, r1, r2 = (bt[r].tolist() for r in range(3))
    exp0 = r0[0:2] + r0[2:4] + r0[8:10] + r0[12:14] + r0[16:20]
    exp1 = r1[0:2] + r1[4:6] + r1[8:20]
    exp2 = r2[0:2] + r2[12:20]
    assert view[0, : len(exp0)].tolist() == exp0
    assert view[1, : len(exp1)].tolist() == exp1
    assert view[2, : len(exp2)].tolist() == exp2


def test_view_offsets_formula():
    ws = _i(160, 64, 32)
    ns = _i(3, 1, 0)
    got = view_offsets(ws, sink_blocks=2, num_selected=ns, blocks_per_chunk=2,
                       block_size=4)
    # offset = window_start - (sink_blocks + n * blocks_per_chunk) * bs
    assert got.tolist() == [160 - (2 + 6) * 4, 64 - (2 + 2) * 4, 32 - 2 * 4]
    assert view_offsets(_i(8), 2, _i(0), 2, 4).tolist() == [0]


# --- end-to-end token semantics ------------------------------------------------------


def _view_positions(view_row, inverse, view_len, bs):
    """Real token positions addressed by the first view_len view tokens."""
    out = []
    for i in range(view_len):
        phys = int(view_row[i // bs])
        out.append(inverse[phys] * bs + i % bs)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_view_addresses_exactly_kept_tokens(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    per_chunk = rng.choice([1, 2, 3])
    chunk = bs * per_chunk
    sink_chunks = rng.choice([0, 1, 2])
    sink_blocks = sink_chunks * per_chunk
    k = rng.choice([1, 3, 5])
    rows = 7
    seq_lens, starts, nsel, sel_rows = [], [], [], []
    for _ in range(rows):
        # window start is chunk-aligned, >= sinks, < seq_len
        num_cand = rng.randint(0, 12)
        start_chunk = sink_chunks + num_cand
        start = start_chunk * chunk
        seq_len = start + rng.randint(1, 3 * chunk + 5)
        n = min(k, num_cand) if rng.random() < 0.8 else 0
        picks = sorted(rng.sample(range(sink_chunks, start_chunk), n))
        pad = [rng.randint(0, 50) for _ in range(k - n)]  # garbage padding
        seq_lens.append(seq_len)
        starts.append(start)
        nsel.append(n)
        sel_rows.append(picks + pad)
    width = max(_cdiv(s, bs) for s in seq_lens) + rng.randint(0, 3)
    bt = _table(rows, width, seed=seed)

    view, _ = build_view(
        bt, sink_blocks, torch.tensor(nsel), torch.tensor(starts) // bs,
        torch.tensor(sel_rows, dtype=torch.int32), per_chunk,
    )
    offsets = view_offsets(torch.tensor(starts), sink_blocks, torch.tensor(nsel),
                           per_chunk, bs)
    for r in range(rows):
        inverse = {int(p): j for j, p in enumerate(bt[r].tolist())}
        seq_len, start, off = seq_lens[r], starts[r], int(offsets[r])
        view_len = seq_len - off
        assert 0 < view_len <= seq_len
        assert _cdiv(view_len, bs) <= width
        got = _view_positions(view[r], inverse, view_len, bs)
        want = list(range(sink_chunks * chunk))
        for c in sel_rows[r][: nsel[r]]:
            want += list(range(c * chunk, (c + 1) * chunk))
        want += list(range(start, seq_len))
        assert sorted(got) == sorted(want), r
        assert len(got) == len(set(got))
        # Document order is kept, and every window token keeps its distance
        # to the row's end: real position p sits at view index p - offset.
        assert got == sorted(got)
        for p in range(start, seq_len):
            assert got[p - off] == p
