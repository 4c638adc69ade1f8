"""deferral.PrefillDeferral: kept passes own copies of their inputs, in order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from vllm_specextend.drafting.deferral import PrefillDeferral, copy_metadata
from vllm_specextend.drafting.kept_passes import Cut


@dataclass
class _Metadata:  # the shape of vLLM's CommonAttentionMetadata: tensors, arrays, ints
    seq_lens: torch.Tensor
    block_table_tensor: torch.Tensor
    host_lens: np.ndarray
    num_reqs: int
    optional: torch.Tensor | None = None


def _metadata():
    return _Metadata(torch.tensor([5, 7]), torch.arange(8).view(2, 4),
                     np.array([5, 7]), 2)


def test_copies_survive_the_runner_rewriting_its_buffers():
    cad = _metadata()
    copied = copy_metadata(cad)
    cad.seq_lens.fill_(0)
    cad.block_table_tensor.fill_(-1)
    cad.host_lens[:] = 0

    assert copied.seq_lens.tolist() == [5, 7]
    assert copied.block_table_tensor.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert copied.host_lens.tolist() == [5, 7]
    assert copied.num_reqs == 2 and copied.optional is None


def test_passes_are_taken_oldest_first_and_named_by_request():
    deferral = PrefillDeferral()
    tokens = torch.arange(4)
    deferral.keep(["a"], tokens, tokens, tokens[:1], _metadata())
    tokens.fill_(9)  # the runner's buffer, rewritten
    deferral.keep(["a", "b"], tokens, tokens, tokens[:2], _metadata())

    assert len(deferral) == 2
    assert deferral.holds_any({"b", "c"}) and not deferral.holds_any({"c"})
    first, second = deferral.take()
    assert first.token_ids.tolist() == [0, 1, 2, 3]
    assert second.req_ids == {"a", "b"} and second.token_ids.tolist() == [9] * 4
    assert len(deferral) == 0 and not deferral.holds_any({"a"})


def test_copies_of_vllms_metadata_share_no_tensor():
    from vllm_specextend import compat

    cad = compat.decode_attn_metadata(
        query_start_loc=torch.tensor([0, 1, 2], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 1, 2], dtype=torch.int32),
        seq_lens=torch.tensor([40, 70], dtype=torch.int32), num_reqs=2,
        num_actual_tokens=2, max_query_len=1, max_seq_len=70,
        block_table_tensor=torch.arange(8, dtype=torch.int32).view(2, 4),
        slot_mapping=torch.tensor([39, 69]),
    )
    copied = copy_metadata(cad)
    for name, value in vars(cad).items():
        if isinstance(value, torch.Tensor):
            twin = getattr(copied, name)
            assert twin.data_ptr() != value.data_ptr(), name
            assert torch.equal(twin, value), name


def _proposer_with_passes(n, fail_at=None):
    from vllm_specextend.proposer import SpecExtendProposer
    from vllm_specextend.serving.stats import SpecExtendStats

    proposer = object.__new__(SpecExtendProposer)  # no engine: the pass loop only
    proposer.deferral, proposer.stats = PrefillDeferral(), SpecExtendStats()
    proposer.num_speculative_tokens = 4
    calls = []

    def base_propose(k, token_ids, *args):
        calls.append((k, int(token_ids[0])))
        proposer.num_speculative_tokens = k  # as vLLM's propose does
        if int(token_ids[0]) == fail_at:
            raise RuntimeError("draft forward failed")

    proposer._greedy_propose = base_propose
    for i in range(n):
        tokens = torch.tensor([i])
        proposer.deferral.keep([f"r{i}"], tokens, tokens, tokens, _metadata())
    return proposer, calls


def test_kept_passes_run_oldest_first_with_k_zero_and_k_comes_back():
    proposer, calls = _proposer_with_passes(3)
    proposer.before_block_copies()

    assert calls == [(0, 0), (0, 1), (0, 2)]
    assert len(proposer.deferral) == 0
    assert proposer.stats.deferred_prefill_passes == 3
    assert proposer.num_speculative_tokens == 4


def test_a_pass_that_fails_stays_kept_with_those_after_it():
    proposer, _ = _proposer_with_passes(3, fail_at=1)
    with pytest.raises(RuntimeError, match="draft forward failed"):
        proposer._run_kept_passes()

    assert [p.token_ids.tolist() for p in proposer.deferral.passes] == [[1], [2]]
    assert proposer.stats.deferred_prefill_passes == 1
    assert proposer.num_speculative_tokens == 4


def test_a_kept_pass_reads_through_its_own_view_copy_and_only_it():
    """``draft_prefill_window``: a kept pass's view is copied with it (the
    staging buffers behind it are reused) and is in force while that pass,
    and no other, runs; the funnel applies it, not the kept metadata."""
    from vllm_specextend.drafting.view import View

    proposer, _ = _proposer_with_passes(0)
    offsets = torch.tensor([32, 0], dtype=torch.int32)
    view = View(torch.arange(8, dtype=torch.int32).view(2, 4), offsets,
                torch.tensor([32, 0], dtype=torch.int32))
    tokens = torch.tensor([7])
    proposer.deferral.keep(["w"], tokens, tokens, tokens, _metadata(), view)
    proposer.deferral.keep(["full"], tokens + 1, tokens, tokens, _metadata())
    offsets.fill_(-1)  # the staging buffer, rewritten by a later step
    seen = []
    proposer._greedy_propose = lambda k, token_ids, *args: seen.append(
        (int(token_ids[0]), None if proposer._view is None
         else proposer._view.offsets.tolist()))
    proposer._run_kept_passes()

    assert seen == [(7, [32, 0]), (8, None)]
    assert proposer._view is None


def _runner(discard, req_ids):
    from types import SimpleNamespace

    return SimpleNamespace(
        discard_request_mask=SimpleNamespace(np=np.array(discard)),
        input_batch=SimpleNamespace(req_ids=list(req_ids)))


def _splitting_proposer(discard, req_ids=("a", "b", "c")):
    proposer, _ = _proposer_with_passes(0)
    proposer.runner = _runner(discard, req_ids)
    proposer._deferral_blocker = None
    proposer._enable_probabilistic_draft_probs = True
    return proposer


GREEDY = type("Sampling", (), {"all_greedy": True})()


@pytest.mark.parametrize("discard, cut", [
    ([False, False, True], Cut(2, kept_first=False)),  # decodes, then a chunk
    ([False, True, True], Cut(1, kept_first=False)),
    # Prompts side by side, the last row's ended first (seen on a GPU).
    ([True, True, False], Cut(2, kept_first=True)),
    ([True, False, False], Cut(1, kept_first=True)),
    ([True, True, True], None),  # nothing samples: the whole step is kept
    ([False, False, False], None),  # every row samples
    ([False, True, False], None),  # three runs: no cut
    ([True, False, True], None),
])
def test_a_step_is_cut_where_its_prompt_chunks_end_or_begin(discard, cut):
    proposer = _splitting_proposer(discard)
    cad = _metadata()
    cad.num_reqs = 3
    assert proposer._split_point(cad, None, GREEDY, 4) == cut


def test_a_cut_names_its_kept_and_drafting_rows():
    tail, head = Cut(2, kept_first=False), Cut(1, kept_first=True)
    assert (tail.kept(3), tail.drafting(3)) == (slice(2, 3), slice(0, 2))
    assert (head.kept(3), head.drafting(3)) == (slice(0, 1), slice(1, 3))


def test_no_cut_for_sampled_drafts_k_zero_or_a_blocked_deferral():
    proposer = _splitting_proposer([False, False, True])
    cad = _metadata()
    cad.num_reqs = 3
    sampled = type("Sampling", (), {"all_greedy": False})()
    assert proposer._split_point(cad, None, sampled, 4) is None
    assert proposer._split_point(cad, None, GREEDY, 0) is None
    proposer._enable_probabilistic_draft_probs = False  # greedy drafts anyway
    assert proposer._split_point(cad, None, sampled, 4) == Cut(2, kept_first=False)
    proposer._deferral_blocker = "an EAGLE head drafts from the target's step"
    assert proposer._split_point(cad, None, GREEDY, 4) is None


def test_a_cut_step_runs_kept_passes_only_for_its_drafting_rows():
    proposer = _splitting_proposer([False, False, True])
    tokens = torch.tensor([0])
    proposer.deferral.keep(["c"], tokens, tokens, tokens, _metadata())
    tail = Cut(2, kept_first=False)  # a and b draft, c's chunk is kept
    assert not proposer._runs_kept_first(False, tail, 3)  # c's pass waits
    assert proposer._runs_kept_first(False, None, 3)
    assert not proposer._runs_kept_first(True, None, 3)
    assert proposer._runs_kept_first(False, Cut(2, kept_first=True), 3)  # c drafts
    proposer.deferral.keep(["b"], tokens, tokens, tokens, _metadata())
    assert proposer._runs_kept_first(False, tail, 3)  # b drafts now


def test_split_rows_gives_each_part_its_own_tokens_and_tables():
    """compat.split_rows on vLLM's own metadata: two decode rows (3 tokens
    each) and a 5-token prompt chunk."""
    from vllm_specextend import compat

    cad = compat.decode_attn_metadata(
        query_start_loc=torch.tensor([0, 3, 6, 11], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 3, 6, 11], dtype=torch.int32),
        seq_lens=torch.tensor([40, 70, 20], dtype=torch.int32), num_reqs=3,
        num_actual_tokens=11, max_query_len=5, max_seq_len=70,
        block_table_tensor=torch.arange(12, dtype=torch.int32).view(3, 4),
        slot_mapping=torch.arange(100, 111),
    )
    runner = type("Runner", (), {"optimistic_seq_lens_cpu": torch.tensor([40, 70, 20])})
    head, tail = compat.split_rows(cad, runner, 2)
    assert (head.num_reqs, head.num_actual_tokens, head.max_query_len) == (2, 6, 3)
    assert head.query_start_loc.tolist() == [0, 3, 6]
    assert head.seq_lens.tolist() == [40, 70] and head.max_seq_len == 70
    assert head.slot_mapping.tolist() == list(range(100, 106))
    assert head.block_table_tensor.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (tail.num_reqs, tail.num_actual_tokens, tail.max_query_len) == (1, 5, 5)
    assert tail.query_start_loc.tolist() == [0, 5]
    assert tail.query_start_loc_cpu.tolist() == [0, 5]
    assert tail.seq_lens.tolist() == [20]
    assert tail.slot_mapping.tolist() == list(range(106, 111))
    assert tail.block_table_tensor.tolist() == [[8, 9, 10, 11]]


@pytest.mark.parametrize("kept_first", [False, True])
def test_a_cut_step_keeps_the_chunks_and_drafts_the_other_rows(kept_first):
    """Two decode rows (3 tokens each) and a 5-token prompt chunk, the chunk
    last or first: its tokens, positions and metadata are kept; the other
    rows draft over their own tokens, sample indices into them, their
    rejected counts; the chunk's drafts are zeros in its row."""
    from vllm_specextend import compat

    lens = [5, 3, 3] if kept_first else [3, 3, 5]
    qsl = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int32)
    cad = compat.decode_attn_metadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor([40, 70, 20], dtype=torch.int32), num_reqs=3,
        num_actual_tokens=11, max_query_len=5, max_seq_len=70,
        block_table_tensor=torch.arange(12, dtype=torch.int32).view(3, 4),
        slot_mapping=torch.arange(100, 111),
    )
    discard = [True, False, False] if kept_first else [False, False, True]
    proposer = _splitting_proposer(discard, req_ids=("a", "b", "c"))
    proposer.runner.optimistic_seq_lens_cpu = torch.tensor([40, 70, 20])
    seen = {}

    def propose(k, token_ids, positions, hidden, next_ids, sample, part, rejected):
        seen.update(tokens=token_ids.tolist(), next=next_ids.tolist(),
                    sample=sample.tolist(), reqs=part.num_reqs,
                    rejected=rejected.tolist())
        return torch.full((part.num_reqs, k), 9)

    proposer._greedy_propose = propose
    proposer._view = None
    tokens = torch.arange(11) + 1000
    sample = qsl[1:] - 1  # each row's last token
    cut = proposer._split_point(cad, None, GREEDY, 4)
    drafts = proposer._propose_split(
        cut, None, 4, tokens, tokens.clone(), torch.tensor([1, 2, 3]), sample, cad,
        torch.tensor([0, 1, 2]))

    kept = proposer.deferral.passes[0]
    drafting = [1, 2] if kept_first else [0, 1]
    chunk = 0 if kept_first else 2
    assert kept.req_ids == {"abc"[chunk]}
    assert kept.token_ids.tolist() == tokens[qsl[chunk]:qsl[chunk + 1]].tolist()
    assert kept.common_attn_metadata.num_actual_tokens == 5
    begin, end = int(qsl[drafting[0]]), int(qsl[drafting[-1] + 1])
    assert seen["tokens"] == tokens[begin:end].tolist()
    assert seen["next"] == [i + 1 for i in drafting]
    assert seen["sample"] == [2, 5]  # each drafting row's last token, in its own
    assert seen["rejected"] == drafting and seen["reqs"] == 2
    assert drafts[chunk].tolist() == [0, 0, 0, 0]
    assert drafts[drafting].eq(9).all()
    assert proposer.stats.split_prefill_steps == 1
