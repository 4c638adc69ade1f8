"""Chunk-selection policy: window start, candidates, mass and top-k (no vLLM)."""

from __future__ import annotations

import pytest
import torch

from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.drafting.view import view_blocks
from vllm_specextend.retrieval.selection import (
    choose_fill,
    chunk_mass,
    held_chunks,
    num_candidates,
    select_chunks,
    uses_view,
    window_start,
    with_predecessors,
)

CONFIGS = [
    SpecExtendConfig(),
    SpecExtendConfig(chunk_size=16, sink_tokens=0, recent_tokens=0, top_k=3),
    SpecExtendConfig(chunk_size=16, sink_tokens=48, recent_tokens=37, top_k=2),
    SpecExtendConfig(policy="streaming", chunk_size=8, sink_tokens=8, recent_tokens=5,
                     top_k=4),
    SpecExtendConfig(chunk_size=1, sink_tokens=3, recent_tokens=2, top_k=1),
]


# --- window_start ----------------------------------------------------------------


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.policy}-{c.chunk_size}")
def test_window_start_properties(cfg):
    c = cfg.chunk_size
    for anchor in range(-5, 3000, 7):
        start = window_start(cfg, anchor)
        assert start % c == 0, (anchor, start)
        assert start >= cfg.sink_tokens, (anchor, start)
        assert start <= max(cfg.sink_tokens, anchor - cfg.window_tokens), (anchor, start)
        # The largest such aligned start: the window is at most one chunk longer.
        if anchor - cfg.window_tokens >= cfg.sink_tokens:
            assert anchor - cfg.window_tokens - start < c, (anchor, start)
        else:
            assert start == cfg.sink_tokens


def test_window_start_is_monotone_in_anchor():
    cfg = SpecExtendConfig(chunk_size=16, sink_tokens=32, recent_tokens=40)
    starts = [window_start(cfg, a) for a in range(0, 1000)]
    assert starts == sorted(starts)


def test_window_start_examples():
    cfg = SpecExtendConfig()  # chunk 32, sink 32, recent 256
    assert window_start(cfg, 0) == 32
    assert window_start(cfg, 256 + 32) == 32
    assert window_start(cfg, 256 + 64) == 64
    assert window_start(cfg, 256 + 95) == 64
    assert window_start(cfg, 256 + 96) == 96
    assert window_start(cfg, 5000) == (5000 - 256) // 32 * 32
    stream = SpecExtendConfig(policy="streaming")
    assert window_start(stream, 5000) == (5000 - 256 - 64 * 32) // 32 * 32


# --- num_candidates / uses_view ------------------------------------------------------


def test_num_candidates():
    cfg = SpecExtendConfig(chunk_size=16, sink_tokens=32)
    assert num_candidates(cfg, 32) == 0
    assert num_candidates(cfg, 0) == 0
    assert num_candidates(cfg, 48) == 1
    assert num_candidates(cfg, 32 + 16 * 10) == 10
    cfg0 = SpecExtendConfig(chunk_size=16, sink_tokens=0)
    assert num_candidates(cfg0, 16 * 7) == 7


def test_uses_view_cmr():
    cfg = SpecExtendConfig(chunk_size=16, sink_tokens=32, top_k=4)
    # Exactly top_k candidates: nothing would be dropped.
    assert not uses_view(cfg, 32 + 4 * 16)
    assert uses_view(cfg, 32 + 5 * 16)
    assert not uses_view(cfg, 32)


def test_uses_view_streaming():
    cfg = SpecExtendConfig(policy="streaming", chunk_size=16, sink_tokens=32, top_k=4)
    assert not uses_view(cfg, 32)
    assert uses_view(cfg, 48)
    cfg0 = SpecExtendConfig(policy="streaming", chunk_size=16, sink_tokens=0)
    assert not uses_view(cfg0, 0)
    assert uses_view(cfg0, 16)


def test_uses_view_full_never():
    cfg = SpecExtendConfig(policy="full", chunk_size=16, sink_tokens=0, top_k=1)
    for start in (0, 16, 10_000, 10**7):
        assert not uses_view(cfg, start)


# --- chunk_mass --------------------------------------------------------------------


def _lse_from_token_logits(logits: torch.Tensor, bs: int) -> torch.Tensor:
    r, h, t = logits.shape
    return torch.logsumexp(logits.view(r, h, t // bs, bs), dim=-1)


@pytest.mark.parametrize("bs,blocks_per_chunk", [(4, 2), (1, 3), (8, 1), (2, 4)])
def test_chunk_mass_matches_dense_softmax(bs, blocks_per_chunk):
    gen = torch.Generator().manual_seed(bs * 10 + blocks_per_chunk)
    rows, heads, num_blocks = 5, 3, 13
    total = num_blocks * bs
    logits = torch.randn(rows, heads, total, generator=gen, dtype=torch.float64) * 3
    ctx = torch.tensor([total, total - 1, 1, bs * 5 + 1, 7 * bs])
    tok = torch.arange(total)
    logits = logits.masked_fill(tok[None, None, :] >= ctx[:, None, None], float("-inf"))
    block_lse = _lse_from_token_logits(logits, bs).float()

    got = chunk_mass(block_lse, blocks_per_chunk)

    num_chunks = num_blocks // blocks_per_chunk
    chunk_tokens = bs * blocks_per_chunk
    probs = torch.softmax(logits, dim=-1)  # over every context token, per head
    want = (
        probs[..., : num_chunks * chunk_tokens]
        .reshape(rows, heads, num_chunks, chunk_tokens)
        .sum(-1)
        .mean(1)
    )
    assert got.shape == (rows, num_chunks)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    # Chunks wholly past the context carry no mass.
    for r in range(rows):
        first_empty = -(-int(ctx[r]) // chunk_tokens)
        assert torch.all(got[r, first_empty:] == 0)


def test_chunk_mass_drops_trailing_partial_chunk():
    # 5 blocks, 2 per chunk: block 4 is dropped even though it has mass.
    lse = torch.log(torch.tensor([[[1.0, 1.0, 2.0, 2.0, 4.0]]]))
    mass = chunk_mass(lse, 2)
    assert mass.shape == (1, 2)
    torch.testing.assert_close(mass, torch.tensor([[2.0 / 10, 4.0 / 10]]))
    assert mass.sum() < 1


def test_chunk_mass_sums_to_one_without_remainder():
    gen = torch.Generator().manual_seed(0)
    lse = torch.randn(4, 6, 12, generator=gen)
    mass = chunk_mass(lse, 3)
    torch.testing.assert_close(mass.sum(-1), torch.ones(4))
    assert torch.all(mass >= 0)


def test_chunk_mass_averages_heads():
    # Head 0 puts all mass on chunk 0, head 1 on chunk 1.
    inf = float("-inf")
    lse = torch.tensor([[[0.0, inf], [inf, 0.0]]])
    torch.testing.assert_close(chunk_mass(lse, 1), torch.tensor([[0.5, 0.5]]))


# --- select_chunks -------------------------------------------------------------------


def test_select_chunks_top_inside_range_sorted():
    mass = torch.tensor(
        [
            [0.9, 0.8, 0.1, 0.5, 0.2, 0.7, 0.3, 0.95],
            [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
        ]
    )
    lo = torch.tensor([1, 0])
    hi = torch.tensor([7, 4])
    out = select_chunks(mass, lo, hi, 3)
    assert out.dtype == torch.int32
    assert out.shape == (2, 3)
    # Row 0: candidates 1..6 -> 0.8 (1), 0.7 (5), 0.5 (3); never 0 or 7.
    assert out[0].tolist() == [1, 3, 5]
    # Row 1: candidates 0..3 -> 3, 2, 1.
    assert out[1].tolist() == [1, 2, 3]


def test_select_chunks_random_against_reference():
    gen = torch.Generator().manual_seed(1)
    rows, num_chunks, k = 32, 40, 6
    mass = torch.rand(rows, num_chunks, generator=gen)
    lo = torch.randint(0, 10, (rows,), generator=gen)
    hi = lo + torch.randint(0, 30, (rows,), generator=gen)
    hi = hi.clamp(max=num_chunks)
    out = select_chunks(mass, lo, hi, k)
    for r in range(rows):
        l, h = int(lo[r]), int(hi[r])
        count = min(k, h - l)
        cand = list(range(l, h))
        best = sorted(sorted(cand, key=lambda c: -float(mass[r, c]))[:count])
        ids = out[r, :count].tolist()
        assert ids == best, (r, l, h)
        assert ids == sorted(ids)
        # The padding after the valid ids never aliases a candidate chunk.
        for extra in out[r, count:].tolist():
            assert not (l <= extra < h)


def test_select_chunks_fewer_candidates_than_k():
    mass = torch.tensor([[0.5, 0.1, 0.3, 0.2, 0.9, 0.8]])
    out = select_chunks(mass, torch.tensor([2]), torch.tensor([4]), 4)
    count = min(4, 4 - 2)
    assert out[0, :count].tolist() == [2, 3]
    assert not any(2 <= x < 4 for x in out[0, count:].tolist())


def test_select_chunks_empty_range():
    mass = torch.rand(2, 5)
    out = select_chunks(mass, torch.tensor([3, 0]), torch.tensor([3, 5]), 2)
    # Row 0 has no candidate: caller's count is 0.
    assert not any(x == 3 for x in out[0].tolist())
    assert out.shape == (2, 2)


def test_select_chunks_ties_stay_in_range():
    # All-equal (even all-zero) mass: still only in-range ids are picked first.
    for value in (0.0, 0.25):
        mass = torch.full((3, 10), value)
        lo = torch.tensor([2, 7, 0])
        hi = torch.tensor([5, 10, 1])
        k = 4
        out = select_chunks(mass, lo, hi, k)
        for r in range(3):
            l, h = int(lo[r]), int(hi[r])
            count = min(k, h - l)
            ids = out[r, :count].tolist()
            assert all(l <= x < h for x in ids), (value, r, ids)
            assert len(set(ids)) == count
            assert ids == sorted(ids)


def test_select_chunks_zero_mass_candidates_beat_out_of_range():
    # Candidates have zero mass, out-of-range chunks have all of it.
    mass = torch.tensor([[1.0, 0.0, 0.0, 0.0, 1.0]])
    out = select_chunks(mass, torch.tensor([1]), torch.tensor([4]), 3)
    assert out[0].tolist() == [1, 2, 3]


def test_held_chunks_sinks_selection_and_window():
    held = held_chunks(
        10, 1,
        window_chunk=torch.tensor([7, 0, 7]),
        selected_chunks=torch.tensor([[2, 4, 9], [2, 4, 9], [3, 5, 0]]),
        num_selected=torch.tensor([2, 0, 3]),
    )
    as_ids = [torch.nonzero(row).flatten().tolist() for row in held]
    assert as_ids[0] == [0, 2, 4, 7, 8, 9]  # chunk 9 is past num_selected
    assert as_ids[1] == list(range(10))  # window from 0: the whole context
    assert as_ids[2] == [0, 3, 5, 7, 8, 9]


@pytest.mark.parametrize("seed", range(5))
def test_held_chunks_are_the_blocks_a_view_reads(seed):
    """Coverage describes the draft's real view: the chunks ``held_chunks``
    names are exactly those whose blocks ``view_blocks`` puts in a row's view."""
    g = torch.Generator().manual_seed(seed)
    rows, bpc, sink_chunks, k, num_chunks = 6, 2, 1, 4, 24
    num_blocks = num_chunks * bpc
    window_chunk = torch.randint(sink_chunks + k, num_chunks, (rows,), generator=g)
    num_selected = torch.randint(0, k + 1, (rows,), generator=g)
    selected = torch.zeros(rows, k, dtype=torch.int64)
    for r in range(rows):
        pool = torch.randperm(int(window_chunk[r]) - sink_chunks, generator=g)
        selected[r] = torch.sort(pool[:k] + sink_chunks).values
    idx = view_blocks((rows, num_blocks), sink_chunks * bpc, num_selected,
                      window_chunk * bpc, selected, bpc)
    held = held_chunks(num_chunks, sink_chunks, window_chunk, selected, num_selected)
    for r in range(rows):
        prefix = (sink_chunks + int(num_selected[r])) * bpc
        view_len = prefix + num_blocks - int(window_chunk[r]) * bpc
        read = set((idx[r, :view_len] // bpc).tolist())
        assert read == set(torch.nonzero(held[r]).flatten().tolist())


def test_followed_mass_pools_the_text_after_the_top_chunks():
    from vllm_specextend.retrieval.selection import followed_mass

    mass = torch.zeros(1, 20)
    mass[0, 3] = 0.5  # a function's name, say: its body follows
    mass[0, 12] = 0.3
    mass[0, 17] = 0.01
    assert torch.equal(followed_mass(mass, 0), mass)
    chosen = select_chunks(followed_mass(mass, 2), torch.tensor([1]),
                           torch.tensor([20]), 6)
    assert chosen.tolist() == [[3, 4, 5, 12, 13, 14]]
    # Without it the pool holds the three chunks with any mass and then ties.
    plain = select_chunks(mass, torch.tensor([1]), torch.tensor([20]), 3)
    assert plain.tolist() == [[3, 12, 17]]


def test_followed_mass_keeps_each_chunks_own_order_within_a_run():
    from vllm_specextend.retrieval.selection import followed_mass

    mass = torch.tensor([[0.0, 0.4, 0.2, 0.0, 0.0]])
    spread = followed_mass(mass, 3)
    # Every chunk after chunk 1 inherits its mass; its own breaks the tie.
    assert spread[0, 1] > spread[0, 2] > spread[0, 3] >= spread[0, 4] > spread[0, 0]


def test_pool_follow_switch(monkeypatch):
    from vllm_specextend.retrieval.selection import pool_follow

    monkeypatch.delenv("SPECEXTEND_POOL_FOLLOW", raising=False)
    assert pool_follow() == 0
    monkeypatch.setenv("SPECEXTEND_POOL_FOLLOW", "15")
    assert pool_follow() == 15
    monkeypatch.setenv("SPECEXTEND_POOL_FOLLOW", "x")
    with pytest.raises(ValueError, match="SPECEXTEND_POOL_FOLLOW"):
        pool_follow()
    monkeypatch.delenv("SPECEXTEND_FILL_FOLLOW", raising=False)
    assert pool_follow("SPECEXTEND_FILL_FOLLOW") == 0
    monkeypatch.setenv("SPECEXTEND_FILL_FOLLOW", "1")
    assert pool_follow("SPECEXTEND_FILL_FOLLOW") == 1


def test_choose_fill_takes_the_top_chunks_without_draft_kv_first():
    mass = torch.tensor([[0.0, 0.3, 0.1, 0.2, 0.05, 0.25, 0.1],
                         [0.0, 0.3, 0.1, 0.2, 0.05, 0.25, 0.1]])
    lo, hi = torch.tensor([1, 1]), torch.tensor([6, 6])  # chunk 6: past the range
    has_kv = torch.tensor([[True, True, False, False, True, False, False],
                           [True, True, True, True, True, False, False]])
    chosen = choose_fill(mass, lo, hi, has_kv, 3)
    # Row 0: 2, 3, 5 lack KV (ranked 5, 3, 2); row 1: only 5 does, then the
    # top ones with KV (1, then 3), in document order.
    assert chosen.tolist() == [[2, 3, 5], [1, 3, 5]]
    assert chosen.dtype == torch.int32


def test_each_filled_chunk_comes_with_the_one_before_it():
    """``with_predecessors``: the chunk before each chosen one joins the
    fill, in document order; one already chosen, or a sink (below ``lo``),
    leaves its place to the best chunks left (without KV first), so every
    row fills twice the chosen count, each chunk once."""
    mass = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.05, 0.4, 0.1, 0.02, 0.0],
                         [0.0, 0.5, 0.45, 0.01, 0.2, 0.1, 0.3, 0.02, 0.0],
                         [0.0, 0.5, 0.45, 0.01, 0.2, 0.1, 0.3, 0.02, 0.0]])
    lo, hi = torch.tensor([1, 1, 1]), torch.tensor([8, 8, 8])
    has_kv = torch.zeros(3, 9, dtype=torch.bool)
    has_kv[2, 6] = True
    chosen = torch.tensor([[3, 5], [1, 2], [1, 2]], dtype=torch.int32)
    filled = with_predecessors(mass, lo, hi, has_kv, chosen)
    # Row 0: 2 and 4 before 3 and 5. Row 1: 1's is a sink, 2's is 1, chosen:
    # the best two left, 6 and 4. Row 2: 6 has KV, so 4 and 5 first.
    assert filled.tolist() == [[2, 3, 4, 5], [1, 2, 4, 6], [1, 2, 4, 5]]
    assert filled.dtype == torch.int32


def test_the_fill_context_switch(monkeypatch):
    from vllm_specextend.retrieval.selection import fill_context

    monkeypatch.delenv("SPECEXTEND_FILL_CONTEXT", raising=False)
    assert fill_context() is False
    monkeypatch.setenv("SPECEXTEND_FILL_CONTEXT", "1")
    assert fill_context() is True
    monkeypatch.setenv("SPECEXTEND_FILL_CONTEXT", "yes")
    with pytest.raises(ValueError, match="SPECEXTEND_FILL_CONTEXT"):
        fill_context()
    monkeypatch.delenv("SPECEXTEND_POOL_CONTEXT", raising=False)
    assert fill_context("SPECEXTEND_POOL_CONTEXT") is False
    monkeypatch.setenv("SPECEXTEND_POOL_CONTEXT", "1")
    assert fill_context("SPECEXTEND_POOL_CONTEXT") is True
