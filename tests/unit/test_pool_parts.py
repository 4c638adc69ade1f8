"""The pooled prompt pass's pure parts (``prompt_pool.py``): the pools' masks,
the pooled rows' queries, the replaced draft inputs, what fits one forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_specextend.drafting.prompt_pool import (
    PoolRows,
    PromptPools,
    fit,
    substitute,
    tails,
)
from vllm_specextend.retrieval.selection import select_chunks


def test_a_pool_allows_its_chunks_and_those_from_the_window_on():
    pools = PromptPools(num_slots=3, pool=2, max_chunks=10, device=torch.device("cpu"))
    pools.put(np.array([1]), torch.tensor([1]), torch.tensor([[2, 5]], dtype=torch.int32),
              torch.tensor([7]), np.array([4]))
    assert pools.allowed[1].nonzero().flatten().tolist() == [2, 5, 7, 8, 9]
    assert pools.unfilled.tolist() == [0, 4, 0]
    assert pools.allowed[0].all() and pools.allowed[2].all(), "other slots untouched"
    assert pools.chunks[1].tolist() == [2, 5]
    assert pools.pooled.tolist() == [False, True, False]
    pools.reset(np.array([0, 1]))  # their prompts start again
    assert pools.allowed.all() and not pools.pooled.any() and not pools.unfilled.any()


def test_selection_keeps_to_the_allowed_chunks():
    mass = torch.tensor([[0.0, 0.9, 0.8, 0.1, 0.2, 0.05]])
    lo, hi = torch.tensor([1]), torch.tensor([6])
    assert select_chunks(mass, lo, hi, 2).tolist() == [[1, 2]]
    allowed = torch.tensor([[True, False, True, False, True, True, True]])
    assert select_chunks(mass, lo, hi, 2, allowed).tolist() == [[2, 4]]


def _pool(full=None):
    # Row 1 ends a 200-token prompt this step (its chunk: 72..200): sinks 32,
    # chunks 1 and 3 of 32 tokens, window from 160.
    return PoolRows(rows=np.array([1]), seq=np.array([200]),
                    window_start=np.array([160]),
                    chunks=torch.tensor([[1, 3]], dtype=torch.int32),
                    sink_tokens=32, chunk_size=32, q_start=np.array([72]), full=full)


def test_take_keeps_each_taken_rows_own_fields():
    pool = PoolRows(rows=np.array([1, 4, 6]), seq=np.array([200, 300, 400]),
                    window_start=np.array([160, 260, 360]),
                    chunks=torch.tensor([[1, 3], [2, 5], [4, 7]], dtype=torch.int32),
                    sink_tokens=32, chunk_size=32, q_start=np.array([72, 172, 272]))
    for index, rows in (([2], [6]), (np.array([True, False, True]), [1, 6]),
                        (slice(0, 3), [1, 4, 6])):
        part = pool.take(index)
        picked = [[1, 4, 6].index(r) for r in rows]
        assert part.rows.tolist() == rows
        assert part.seq.tolist() == [pool.seq[i] for i in picked]
        assert part.chunks.tolist() == [pool.chunks[i].tolist() for i in picked]
        assert part.q_start.tolist() == [pool.q_start[i] for i in picked]
        assert part.full.tolist() == [True] * len(rows)


def test_a_pooled_rows_query_is_its_sinks_pool_and_window():
    pool = _pool()
    assert pool.query_lens().tolist() == [32 + 64 + 40]
    expected = (list(range(32)) + list(range(32, 64)) + list(range(96, 128))
                + list(range(160, 200)))
    assert pool.positions(0).tolist() == expected
    alone = _pool(full=np.array([False]))
    assert alone.query_lens().tolist() == [40]
    assert alone.positions(0).tolist() == list(range(160, 200))


def _cad(query_lens, seq_lens, block_size=16, width=16):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    num_reqs = len(query_lens)
    # Row r's logical block j is physical block 100 * r + j.
    table = torch.tensor([[100 * r + j for j in range(width)] for r in range(num_reqs)],
                         dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=torch.from_numpy(qsl), query_start_loc_cpu=torch.from_numpy(qsl),
        seq_lens=seq, num_reqs=num_reqs, num_actual_tokens=int(qsl[-1]),
        max_query_len=int(max(query_lens)), max_seq_len=int(max(seq_lens)),
        block_table_tensor=table,
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64),
        _num_computed_tokens_cpu=seq - torch.tensor(query_lens, dtype=torch.int32),
    )


def test_substitute_replaces_the_pooled_rows_query_only():
    # Row 0 decodes (3 tokens at 50..52), row 1 ends its prompt (72..199),
    # row 2 decodes (2 tokens at 30..31).
    cad = _cad([3, 128, 2], [53, 200, 32])
    token_ids = torch.arange(1000, 1000 + 133)
    positions = torch.cat([torch.arange(50, 53), torch.arange(72, 200),
                           torch.arange(30, 32)])
    prompt = torch.arange(5000, 5200)  # row 1's token ids: 5000 + position
    sample = torch.tensor([1, 130, 132])  # row 0 samples one before its end
    pool = _pool()
    tokens, pos, sample, new, first = substitute(pool, [prompt], token_ids, positions,
                                                 sample, cad, block_size=16)
    n = 136
    assert new.query_start_loc_cpu.tolist() == [0, 3, 3 + n, 5 + n]
    assert new.query_start_loc.tolist() == [0, 3, 3 + n, 5 + n]
    assert new.num_actual_tokens == 5 + n and new.max_query_len == n
    assert torch.equal(tokens[:3], token_ids[:3]) and torch.equal(tokens[-2:], token_ids[-2:])
    assert torch.equal(pos[3:3 + n], pool.positions(0))
    assert torch.equal(tokens[3:3 + n], 5000 + pool.positions(0))
    assert sample.tolist() == [1, 2 + n, 4 + n], "as far from each row's end as before"
    # Slots through the real table: row 1's position p sits in block 100 + p // 16.
    p = pos[3:3 + n]
    assert torch.equal(new.slot_mapping[3:3 + n], (100 + p // 16) * 16 + p % 16)
    assert torch.equal(new.slot_mapping[:3], 50 + torch.arange(3) + 3 * 16 - 48)
    assert torch.equal(new.seq_lens, cad.seq_lens), "contexts unchanged"
    assert new._num_computed_tokens_cpu.tolist() == [50, 200 - n, 30]
    # vLLM's first forward: row 1's tokens after row 0's 3 + 1 (its next
    # token), then its own next token at position 200.
    assert first.index.tolist() == list(range(4, 4 + n + 1))
    assert first.positions.tolist() == pool.positions(0).tolist() + [200]
    assert set(first.rows.tolist()) == {1}


def test_tails_cut_every_rows_query_to_its_last_tokens():
    """A step whose pooled pass ran first drafts as a decode step: row 1 (its
    prompt's last 128 tokens) keeps its last 3, the decode rows all of theirs;
    tokens, positions and slots are the kept tokens' own."""
    cad = _cad([3, 128, 3], [53, 200, 33])
    cad.slot_mapping = torch.arange(134, dtype=torch.int64) + 7000
    token_ids = torch.arange(1000, 1134)
    positions = torch.cat([torch.arange(50, 53), torch.arange(72, 200),
                           torch.arange(30, 33)])
    sample = torch.tensor([1, 130, 133])  # row 0 samples one before its end
    tokens, pos, sample, new = tails(token_ids, positions, sample, cad, 3)
    keep = [0, 1, 2, 128, 129, 130, 131, 132, 133]
    assert tokens.tolist() == [1000 + i for i in keep]
    assert pos.tolist() == [50, 51, 52, 197, 198, 199, 30, 31, 32]
    assert new.slot_mapping.tolist() == [7000 + i for i in keep]
    assert new.query_start_loc_cpu.tolist() == [0, 3, 6, 9]
    assert new.query_start_loc.tolist() == [0, 3, 6, 9]
    assert new.num_actual_tokens == 9 and new.max_query_len == 3
    assert sample.tolist() == [1, 5, 8], "as far from each row's end as before"
    assert torch.equal(new.seq_lens, cad.seq_lens), "contexts unchanged"
    assert new._num_computed_tokens_cpu.tolist() == [50, 197, 30]


def test_the_first_forwards_positions_and_slots_are_the_pooled_rows_own():
    """vLLM numbers a row's first-forward tokens on from its first one; the
    pooled row's own positions and slots replace those."""
    cad = _cad([3, 128, 2], [53, 200, 32])
    pool = _pool()
    n = 136
    *_, new, first = substitute(pool, [torch.arange(5000, 5200)],
                                torch.arange(133), torch.arange(133), None, cad, 16)
    buffer = torch.arange(3 + n + 2 + 3)  # vLLM's contiguous numbering, 1 slot a row
    new.slot_mapping = torch.full((3 + n + 2 + 3,), -1, dtype=torch.int64)
    first.apply(buffer, new, block_size=16)
    p = pool.positions(0).tolist() + [200]
    assert buffer[4:4 + n + 1].tolist() == p
    assert buffer[:4].tolist() == [0, 1, 2, 3], "the other rows as vLLM set them"
    p = torch.tensor(p)
    assert torch.equal(new.slot_mapping[4:4 + n + 1], (100 + p // 16) * 16 + p % 16)
    assert (new.slot_mapping[:4] == -1).all()


@pytest.mark.parametrize("capacity, full", [(400, [True, True]), (250, [True, False]),
                                            (100, [False, False])])
def test_fit_keeps_the_first_forward_within_the_drafters_buffer(capacity, full):
    pool = PoolRows(rows=np.array([0, 1]), seq=np.array([200, 300]),
                    window_start=np.array([160, 256]),
                    chunks=torch.tensor([[1, 3], [2, 4]], dtype=torch.int32),
                    sink_tokens=32, chunk_size=32, q_start=np.array([192, 100]))
    # Full passes: 136 and 140 tokens; alone: 8 and 44; queries now 8 and 200:
    # with both full 278 tokens and 2 next tokens, with the first only 182.
    assert fit(pool, 208, np.array([8, 200]), 2, capacity).tolist() == full


@pytest.mark.gpu
def test_a_pooled_steps_inputs_are_built_without_a_sync():
    """A sync in a pooled step waits for the target's whole forward, and the
    GPU then idles while the host builds the step's draft (the batch-8 first
    token's profile, 2026-11-29): ``take``, ``substitute`` and ``tails`` on
    device tensors must not synchronize (a copy from pageable memory would)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    cad = _cad([3, 128, 3], [53, 200, 33])
    cad = cad.replace(query_start_loc=cad.query_start_loc.to(dev),
                      seq_lens=cad.seq_lens.to(dev),
                      block_table_tensor=cad.block_table_tensor.to(dev),
                      slot_mapping=cad.slot_mapping.to(dev))
    pool = _pool()
    pool.chunks = pool.chunks.to(dev)
    two = PoolRows(rows=np.array([0, 1]), seq=np.array([53, 200]),
                   window_start=np.array([0, 160]), chunks=torch.zeros(
                       2, 2, dtype=torch.int32, device=dev),
                   sink_tokens=32, chunk_size=32, q_start=np.array([50, 72]))
    token_ids = torch.arange(1000, 1134, device=dev)
    positions = torch.cat([torch.arange(50, 53), torch.arange(72, 200),
                           torch.arange(30, 33)]).to(dev)
    prompt = torch.arange(5000, 5200, device=dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        two.take(np.array([False, True]))
        two.take([1])
        substitute(pool, [prompt], token_ids, positions, None, cad, block_size=16)
        tails(token_ids, positions, None, cad, 3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_a_pool_grows_by_the_chunks_of_its_own_rows_only():
    """``PromptPools.grow``: the fill's chunks join their rows' pools (and
    leave the rest as they were), the host's count of chunks still without
    draft KV going down by the fill's width, never below 0."""
    pools = PromptPools(num_slots=3, pool=2, max_chunks=8, device=torch.device("cpu"))
    slots = np.array([0, 2])
    pools.put(slots, torch.from_numpy(slots), torch.tensor([[1, 2], [0, 3]]),
              torch.tensor([6, 6]), np.array([3, 1]))
    pools.grow(np.array([2]), torch.tensor([2]), torch.tensor([[4, 5]]), 2)
    assert pools.allowed[2].tolist() == [True, False, False, True, True, True, True, True]
    assert pools.allowed[0].tolist() == [False, True, True, False, False, False, True, True]
    assert pools.unfilled.tolist() == [3, 0, 0]
    # With context (SPECEXTEND_FILL_CONTEXT) only the chosen count comes off.
    pools.grow(np.array([0]), torch.tensor([0]), torch.tensor([[3, 4, 5, 6]]), 2)
    assert pools.unfilled.tolist() == [1, 0, 0]


@pytest.mark.parametrize("env, graph, rows", [
    (None, 507, 32),  # the drafter's buffers: 8,192 // 256
    ("1", 507, 1),  # within the draft's largest graph
    ("1", None, 32),  # an eager draft: the buffers again
    ("0", 507, 32),
])
def test_fill_rows_per_forward(monkeypatch, env, graph, rows):
    from vllm_specextend.drafting.pool_fill import fill_in_graphs, rows_per_forward

    monkeypatch.delenv("SPECEXTEND_FILL_IN_GRAPHS", raising=False)
    if env is not None:
        monkeypatch.setenv("SPECEXTEND_FILL_IN_GRAPHS", env)
    graph = graph if fill_in_graphs() else None
    assert rows_per_forward(256, 8192, graph) == rows
    assert rows_per_forward(9000, 8192, graph) == 1  # a row never waits


def test_fill_in_graphs_refuses_another_value(monkeypatch):
    from vllm_specextend.drafting.pool_fill import fill_in_graphs

    monkeypatch.setenv("SPECEXTEND_FILL_IN_GRAPHS", "yes")
    with pytest.raises(ValueError, match="SPECEXTEND_FILL_IN_GRAPHS='yes'"):
        fill_in_graphs()
