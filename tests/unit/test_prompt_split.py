"""``prompt_split``: a first draft forward's long prompt rows cut into pieces
that read the sinks and a window before them (``draft_prefill_window``).

The cut metadata is run through a naive paged attention (bottom-right causal,
as vLLM's kernels read a row) and compared with attention masked by hand:
each query of a piece sees the sink tokens, the tokens from its piece's
window start to itself, nothing else; a sampling row's last query, and every
row not cut, see what they saw before.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from test_pool_parts import _cad as pool_cad

from vllm_specextend.drafting.deferral import copy_metadata
from vllm_specextend.drafting.host_step import HostStep
from vllm_specextend.drafting.prompt_split import PromptSplit, SplitView, piece_tokens
from vllm_specextend.drafting.view import View
from vllm_specextend.retrieval.planner import BatchLens
from vllm_specextend.serving.stats import SpecExtendStats

BS = 4
SINK_BLOCKS = 1
WINDOW = 8
PIECE = 6
WIDTH = 24  # blocks a row's table holds


def _cad(query_lens, seq_lens):
    """Row r's logical block j is physical block 100 * r + j (all distinct)."""
    return pool_cad(query_lens, seq_lens, width=WIDTH)


def _split(q_start, prompt, samples, stats=None):
    return PromptSplit(**_fields(q_start, prompt, samples, stats))


def _fields(q_start, prompt, samples, stats=None):
    return dict(q_start=np.asarray(q_start, dtype=np.int64),
                prompt=np.asarray(prompt), samples=np.asarray(samples),
                window=WINDOW, sink_blocks=SINK_BLOCKS, block_size=BS,
                piece=PIECE, stats=stats)


def _paged_attention(q, k_cache, v_cache, cad):
    """What the attention kernels compute from ``cad``: row r's queries are
    the last ones of its ``seq_lens[r]`` keys, read through its block table,
    each seeing the keys up to its own place (bottom-right causal)."""
    out = torch.zeros_like(q)
    qsl = cad.query_start_loc.tolist()
    for r in range(cad.num_reqs):
        n, s = qsl[r + 1] - qsl[r], int(cad.seq_lens[r])
        slots = (cad.block_table_tensor[r].long()[:, None] * BS
                 + torch.arange(BS)).flatten()[:s]
        k, v = k_cache[slots], v_cache[slots]
        for i in range(n):
            seen = s - n + i + 1
            w = torch.softmax(q[qsl[r] + i] @ k[:seen].T, dim=-1)
            out[qsl[r] + i] = w @ v[:seen]
    return out


def _masked_attention(q, k_cache, v_cache, cad, visible):
    """Attention of each query over the keys ``visible(row, position)`` lists
    (positions of the row), read from the real table."""
    out = torch.zeros_like(q)
    qsl = cad.query_start_loc.tolist()
    for r in range(cad.num_reqs):
        n, s = qsl[r + 1] - qsl[r], int(cad.seq_lens[r])
        for i in range(n):
            pos = s - n + i
            keys = torch.tensor(visible(r, pos))
            slots = cad.block_table_tensor[r].long()[keys // BS] * BS + keys % BS
            w = torch.softmax(q[qsl[r] + i] @ k_cache[slots].T, dim=-1)
            out[qsl[r] + i] = w @ v_cache[slots]
    return out


def _window_of(pos, query_start):
    """The keys a cut row's query at ``pos`` sees: the sinks and its piece's
    window, the piece counted from the row's first query past the window."""
    sink_end = SINK_BLOCKS * BS
    first_cut = sink_end + WINDOW + BS
    if pos < max(query_start, first_cut):
        return list(range(pos + 1))  # before any window drops a block
    start = max(query_start, first_cut)
    piece_start = start + (pos - start) // PIECE * PIECE
    window = max(SINK_BLOCKS, (piece_start - WINDOW) // BS) * BS
    return list(range(sink_end)) + list(range(window, pos + 1))


def test_each_piece_reads_the_sinks_and_its_window_and_other_rows_are_unchanged():
    # Row 0 decodes (3 queries at 40..42); row 1 ends its prompt (queries
    # 10..63, samples: its last query reads the whole row); row 2 computes a
    # prompt chunk that ends no prompt (queries 0..39, every one cut).
    cad = _cad([3, 54, 40], [43, 64, 40])
    gen = torch.Generator().manual_seed(0)
    num_slots = (100 * 2 + WIDTH) * BS  # row 2's last block is the highest
    q = torch.randn(cad.num_actual_tokens, 8, generator=gen)
    k_cache, v_cache = (torch.randn(num_slots, 8, generator=gen) for _ in range(2))
    stats = SpecExtendStats()
    split = _split([40, 10, 0], [False, True, True], [True, True, False], stats)

    cut = split.apply(cad, cad)

    def visible(r, pos):
        if r == 0 or (r == 1 and pos == 63):
            return list(range(pos + 1))
        return _window_of(pos, [40, 10, 0][r])

    expected = _masked_attention(q, k_cache, v_cache, cad, visible)
    torch.testing.assert_close(_paged_attention(q, k_cache, v_cache, cut), expected)
    assert cut.num_reqs > cad.num_reqs and cut.num_actual_tokens == cad.num_actual_tokens
    assert torch.equal(cut.slot_mapping, cad.slot_mapping), "KV writes unchanged"
    assert cut.max_query_len == SINK_BLOCKS * BS + WINDOW + BS  # row 2's whole-context part
    # Pieces that drop blocks: row 1's 16..63 in 6s, row 2's 16..39 (the
    # rows' whole-context heads are not pieces).
    assert stats.prompt_pieces == 8 + 4
    # The cut is exactly what the masks say: a window drops keys somewhere.
    full = _masked_attention(q, k_cache, v_cache, cad, lambda r, p: list(range(p + 1)))
    assert not torch.allclose(expected, full)


def test_rows_read_through_the_steps_view_keep_it():
    # Row 0 decodes through a view that drops blocks 1..5 (offset 20); row 1
    # is a prompt row cut into pieces: the view must stay on row 0 only.
    cad = _cad([2, 40], [60, 40])
    view = View(block_table=torch.cat([
        torch.cat([cad.block_table_tensor[0, :1], cad.block_table_tensor[0, 6:]]),
        torch.zeros(5, dtype=torch.int32)]).view(1, -1).repeat(2, 1),
        offsets=torch.tensor([20, 0], dtype=torch.int32),
        offsets_cpu=torch.tensor([20, 0], dtype=torch.int32))
    view.block_table[1] = cad.block_table_tensor[1]
    split = _split([58, 0], [False, True], [True, False])

    cut = SplitView(view, split).first(cad)
    later = SplitView(view, split).apply(cad)

    assert later.num_reqs == 2 and torch.equal(later.seq_lens, view.apply(cad).seq_lens)
    assert int(cut.seq_lens[0]) == 40 and torch.equal(cut.block_table_tensor[0],
                                                      view.block_table[0])
    assert cut.num_reqs > 2


def test_no_row_long_enough_leaves_the_metadata_as_it_was():
    cad = _cad([3, 2 * PIECE], [43, 2 * PIECE])
    split = _split([40, 0], [False, True], [True, True])

    assert split.apply(cad, cad) is cad


def test_a_step_over_vllms_row_limit_gets_longer_pieces_and_its_parts_keep_them():
    # Three prompt chunks of 200 side by side: at pieces of 6 they need ~90
    # sub-rows. Under a limit of 24 the step's pieces grow; a kept pass of
    # its first row alone (a part of the step) must cut as the step did,
    # not with the pieces one row alone would fit (GPU test, 2026-12-06).
    q_lens = np.array([200, 200, 200])
    step = PromptSplit.for_step(q_lens, 24, **_fields([0, 300, 600], [True] * 3,
                                                       [False] * 3))
    qsl = np.concatenate([[0], np.cumsum(q_lens + 1)])

    whole, part = step.plan(qsl), step.rows(0, 1).plan(qsl[:2])

    assert step.piece > PIECE and whole.src.size <= 24
    assert part.lens.tolist() == whole.lens[whole.src == 0].tolist()
    assert PromptSplit.for_step(q_lens, 24, **_fields([0] * 3, [False] * 3,
                                                       [False] * 3)) is None


def test_a_cut_step_and_a_kept_pass_keep_their_rows_split():
    stats = SpecExtendStats()
    split = _split([40, 10, 0], [False, True, True], [True, True, False], stats)
    view = SplitView(None, split)

    part = view.rows(1, 3)
    kept = copy_metadata(part)

    assert part.split.q_start.tolist() == [10, 0]
    assert kept.split.samples.tolist() == [True, False]
    assert kept.split.q_start is not part.split.q_start, "copied: the runner moves on"
    assert kept.split.stats is stats, "a kept pass counts its pieces where the step would"


def test_the_step_splits_its_rows_and_a_chunk_that_ends_its_prompt_samples():
    # Row 0 decodes; row 1's chunk ends its 9,000-token prompt (its last
    # query samples the first draft token: it reads the row whole); row 2's
    # chunk of 5,000 ends no prompt. HostStep._prompt_split on a stand-in
    # proposer (what it reads of one).
    lens = BatchLens(seq=np.array([20_000, 9_000, 5_000]),
                     num_prompt=np.array([100, 9_000, 12_000]),
                     q_start=np.array([19_996, 1_000, 0]))
    step = SimpleNamespace(lens=lens, drafting=np.array([True, False, False]))
    proposer = SimpleNamespace(
        cfg=SimpleNamespace(draft_prefill_window=1024), block_size=16, stats=None,
        view_builder=SimpleNamespace(sink_blocks=2),
        vllm_config=SimpleNamespace(
            scheduler_config=SimpleNamespace(max_num_seqs=256),
            compilation_config=SimpleNamespace(max_cudagraph_capture_size=512)))

    split = HostStep._prompt_split(proposer, step)

    assert split.prompt.tolist() == [False, True, True]
    assert split.samples.tolist() == [True, True, False]  # row 0 samples, uncut
    qsl = np.concatenate([[0], np.cumsum(lens.seq - lens.q_start + 1)])
    sub = split.plan(qsl)
    assert sub.src.tolist()[-1] == 2 and (sub.window_block[sub.src == 1] == -1).sum() == 1
    assert sub.lens[(sub.src == 1) & (sub.window_block == -1)].tolist() == [1]
    proposer.cfg.draft_prefill_window = None
    assert HostStep._prompt_split(proposer, step) is None


@pytest.mark.parametrize("value", ["0", "x", "-3"])
def test_a_bad_piece_switch_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("SPECEXTEND_PROMPT_PIECE", value)
    with pytest.raises(ValueError, match="SPECEXTEND_PROMPT_PIECE"):
        piece_tokens()
