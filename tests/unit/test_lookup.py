"""TokenHistory (``lookup_tokens``): the batched lookup equals the rule written
per row, and the history holds each request's verified tokens (no vLLM).

The reference below is the rule as ``lookup.py`` states it, one row at a
time, over plain lists; the device code must propose the same tokens for
random batches (small vocabularies, so keys repeat), rows without a match,
matches whose continuation runs past the verified end, and a slot that a
new, shorter request reuses.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from vllm_specextend.drafting.lookup import (
    LOOKUP_KEY,
    LOOKUP_LONGEST,
    LookupRows,
    TokenHistory,
    bonus_positions,
    drafted,
    lookup_min_match,
)

N = LOOKUP_KEY
CPU = torch.device("cpu")


def reference(history: list[int], bonus: int, drafts: list[int], m: int,
              n: int = N) -> list[int]:
    """The rule per row: an end j <= bonus - 1 where the history's tokens up
    to j equal the last ones of [context, bonus, drafts], at least n of them;
    the longest (counted up to LOOKUP_LONGEST), then one with m verified
    tokens after it, then the latest; the m tokens after it while verified,
    else the last draft."""
    seq = history[: bonus + 1] + drafts
    best, end = None, -1
    for j in range(bonus):
        length = 0
        while (length < LOOKUP_LONGEST and j - length >= 0
               and history[j - length] == seq[-1 - length]):
            length += 1
        if length >= n and (rank := (length, j + m <= bonus, j)) > (best or ()):
            best, end = rank, j
    return [history[end + i] if end >= 0 and end + i <= bonus else drafts[-1]
            for i in range(1, m + 1)]


def _history(rows: list[list[int]], max_len: int, k: int, n: int = N) -> TokenHistory:
    h = TokenHistory(len(rows), max_len, k, CPU, n)
    for slot, tokens in enumerate(rows):
        h.tokens[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
    return h


def _look_up(h, slots, bonus, drafts, m):
    rows = LookupRows(torch.tensor(slots), torch.tensor(bonus))
    return h.look_up(rows, torch.tensor(drafts), m).tolist()


@pytest.mark.parametrize("seed", range(50))
def test_lookup_matches_the_rule_per_row(seed):
    rng = random.Random(seed)
    n = (N, N, 1, 2)[seed % 4]  # the shortest match taken
    max_len, k = rng.choice([16, 40, 97]), 8
    vocab = rng.choice([2, 3, 5, 50])
    num_slots = rng.randint(1, 6)
    # Whole rows of random tokens: past a row's bonus they stand for rejected
    # drafts and an earlier request's tokens, which no lookup may read.
    h = _history([[rng.randrange(vocab) for _ in range(max_len + k + 2)]
                  for _ in range(num_slots)], max_len, k, n)
    batch = rng.randint(1, 5)
    r, m = rng.randint(1, 5), rng.randint(1, 6)
    slots = [rng.randrange(num_slots) for _ in range(batch)]
    bonus = [rng.randint(0, max_len) for _ in range(batch)]
    drafts = [[rng.randrange(vocab) for _ in range(r)] for _ in range(batch)]
    got = _look_up(h, slots, bonus, drafts, m)
    rows = h.tokens.tolist()
    want = [reference(rows[s], b, d, m, n) for s, b, d in zip(slots, bonus, drafts)]
    assert got == want


def test_no_match_repeats_the_last_draft():
    h = _history([list(range(100, 130))], 40, 4)
    assert _look_up(h, [0], [20], [[7, 8, 9]], 3) == [[9, 9, 9]]


def test_the_latest_full_match_wins_and_stops_at_the_verified_end():
    # "1 2 3" occurs ending at 3 and at 9; the bonus sits at 11.
    tokens = [0, 1, 2, 3, 4, 5, 6, 1, 2, 3, 8, 1]
    h = _history([tokens + [2, 3, 60, 61, 62]], 40, 4)
    # Key [1, 2, 3]: bonus 1 (position 11), drafts 2, 3. Both matches have
    # two verified tokens after them: the latest (ending at 9) wins.
    assert _look_up(h, [0], [11], [[2, 3]], 2) == [[8, 1]]
    # Four asked for: only the match ending at 3 has four verified after it.
    assert _look_up(h, [0], [11], [[2, 3]], 4) == [[4, 5, 6, 1]]
    # Neither has nine: the latest gives its two, then the last draft.
    assert _look_up(h, [0], [11], [[2, 3]], 9) == [[8, 1] + [3] * 7]
    # A match whose end is the bonus itself has nothing verified after it:
    # the earlier one is taken.
    h = _history([[1, 2, 3, 7, 0, 1, 2, 3]], 40, 4)
    assert _look_up(h, [0], [7], [[1, 2, 3]], 2) == [[7, 0]]


def test_a_shorter_match_is_taken_only_where_asked():
    # The sequence ends "7 9": "9" alone occurs at 2 (then 40 41), "7 9" nowhere.
    h = _history([[0, 5, 9, 40, 41, 6, 7] + [0] * 8], 40, 4)
    assert _look_up(h, [0], [6], [[9]], 2) == [[9, 9]]  # 3 tokens at least
    h = _history([[0, 5, 9, 40, 41, 6, 7] + [0] * 8], 40, 4, 1)
    assert _look_up(h, [0], [6], [[9]], 2) == [[40, 41]]


@pytest.mark.parametrize("value, want", [(None, N), ("1", 1), ("8", 8)])
def test_the_shortest_match_from_the_environment(monkeypatch, value, want):
    if value is None:
        monkeypatch.delenv("SPECEXTEND_LOOKUP_MIN_MATCH", raising=False)
    else:
        monkeypatch.setenv("SPECEXTEND_LOOKUP_MIN_MATCH", value)
    assert lookup_min_match() == want


@pytest.mark.parametrize("value", ["0", "9", "two"])
def test_a_bad_shortest_match_names_the_range(monkeypatch, value):
    monkeypatch.setenv("SPECEXTEND_LOOKUP_MIN_MATCH", value)
    with pytest.raises(ValueError, match="use 1 to 8 tokens"):
        lookup_min_match()


def test_a_longer_match_wins_over_a_later_one():
    # "5 1 2 3" ends at 4, "1 2 3" alone at 8 (after 6, not 5); bonus at 12.
    tokens = [0, 5, 1, 2, 3, 40, 41, 6, 1, 2, 3, 42, 5]
    h = _history([tokens + [0] * 8], 40, 4)
    # The sequence ends "5 1 2 3" (bonus 5, drafts 1 2 3): the match at 4.
    assert _look_up(h, [0], [12], [[1, 2, 3]], 2) == [[40, 41]]
    # With a 6 before the same three drafts, the match ending at 8.
    h.tokens[0, 12] = 6
    assert _look_up(h, [0], [12], [[1, 2, 3]], 2) == [[42, 6]]
    # Longer beats full: "5 1 2 3" ends at 10 with 2 verified after it (of 4
    # asked), "1 2 3" alone at 2 with all 4 verified after it.
    h = _history([[1, 2, 3, 30, 31, 32, 33, 5, 1, 2, 3, 44, 5] + [0] * 8], 40, 4)
    assert _look_up(h, [0], [12], [[1, 2, 3]], 4) == [[44, 5, 3, 3]]


def _record(h, slots, rows_tokens, rows_start, next_ids, rejected=None):
    """One step: each row's tokens from its start position."""
    tokens = torch.tensor([t for row in rows_tokens for t in row], dtype=torch.int32)
    positions = torch.tensor([s + i for row, s in zip(rows_tokens, rows_start)
                              for i in range(len(row))])
    qsl = torch.tensor([0] + [len(r) for r in rows_tokens]).cumsum(0)
    return h.record(torch.tensor(slots), tokens, positions,
                    torch.tensor(next_ids, dtype=torch.int32), qsl,
                    None if rejected is None else torch.tensor(rejected))


def test_record_keeps_each_rows_verified_tokens():
    k = 3
    h = TokenHistory(2, 64, k, CPU)
    # Prompts in two chunks for slot 1, one for slot 0.
    rows = _record(h, [0, 1], [[1, 2, 3, 4], [9, 8, 7]], [0, 0], [5, 0])
    assert rows.bonus.tolist() == [4, 3]
    rows = _record(h, [1], [[6, 5]], [3], [4])
    assert rows.bonus.tolist() == [5]
    # Decode: [t_p, d_1..d_3] at p..p+3; row 0 accepts 1 draft (2 rejected),
    # row 1 accepts all 3 (0 rejected).
    rows = _record(h, [0, 1], [[5, 6, 60, 61], [4, 3, 2, 1]], [4, 5], [7, 0],
                   rejected=[2, 0])
    assert rows.bonus.tolist() == [6, 9]
    assert h.tokens[0, :7].tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert h.tokens[1, :10].tolist() == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]


def test_bonus_position_of_the_padded_drafter_batch():
    # Two decode rows of K=4 at p=10 and p=50: 3 and 0 rejected.
    positions = torch.tensor(list(range(10, 15)) + list(range(50, 55)))
    qsl = torch.tensor([0, 5, 10])
    assert bonus_positions(positions, qsl, torch.tensor([3, 0])).tolist() == [12, 55]
    assert bonus_positions(positions, qsl, None).tolist() == [15, 55]


def test_a_reused_slot_never_matches_the_old_requests_tokens():
    h = TokenHistory(1, 64, 4, CPU)
    old = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    _record(h, [0], [old], [0], [13])
    # The old request's "4 5 6" would continue with 7 8; the new, shorter
    # request's context does not hold it before its bonus.
    rows = _record(h, [0], [[20, 21, 22]], [0], [4])
    assert _look_up(h, [0], rows.bonus.tolist(), [[5, 6]], 3) == [[6, 6, 6]]
    # Its own repeats are found.
    rows = _record(h, [0], [[20, 21, 4, 5, 6, 30, 31, 4]], [0], [5])
    assert _look_up(h, [0], rows.bonus.tolist(), [[6]], 3) == [[30, 31, 4]]


def test_fresh_rows_are_the_slots_that_changed_hands():
    h = TokenHistory(3, 16, 2, CPU)
    assert h.fresh(["a", "b"], np.array([0, 1])) == [0, 1]
    assert h.fresh(["a", "b"], np.array([0, 1])) == []
    assert h.fresh(["b", "c"], np.array([1, 0])) == [1]


def test_fresh_sees_requests_back_in_each_others_slots():
    # Preempted and resumed in the same order, in swapped slots: the same
    # request ids, other slots; both rows changed hands.
    h = TokenHistory(4, 16, 2, CPU)
    assert h.fresh(["a", "b"], np.array([2, 3])) == [0, 1]
    assert h.fresh(["a", "b"], np.array([3, 2])) == [0, 1]


def test_fresh_follows_the_states_slot_mapping():
    from vllm_specextend.retrieval.state import SelectionState

    state, h = SelectionState(4, 2, CPU), TokenHistory(4, 16, 2, CPU)
    slots, _ = state.slots_for(["a", "b"])
    assert h.fresh(["a", "b"], slots) == [0, 1]
    slots, _ = state.slots_for(["a", "b"])  # the same mapping, the same array
    assert h.fresh(["a", "b"], slots) == []
    # Preempted, resumed in the same order: freed slots come back swapped.
    state.release(["a", "b"])
    slots, _ = state.slots_for(["a", "b"])
    assert h.fresh(["a", "b"], slots) == [0, 1]


def test_a_filled_placeholder_is_never_proposed():
    # Under async scheduling the runner's host copy holds -1 at output
    # positions; a fill copies them. A match followed by one proposes d_r.
    h = _history([[5, 6, 7, 8, 9, -1, -1, 7, 8]], 32, 4)
    assert _look_up(h, [0], [8], [[6, 7, 8]], 2) == [[9, 8]]


def test_extend_appends_the_lookup():
    h = _history([[1, 2, 3, 4, 1, 2]], 16, 4)
    out = h.extend(LookupRows(torch.tensor([0]), torch.tensor([5])),
                   torch.tensor([[3]]), 2)
    assert out.tolist() == [[3, 4, 1]]


@pytest.mark.parametrize("k, m, want", [(8, 5, 3), (7, 4, 3), (4, 4, 4), (2, 5, 2),
                                        (0, 5, 0), (4, 0, 4)])
def test_drafted_leaves_a_draft_forward(k, m, want):
    assert drafted(k, m) == want


@pytest.mark.gpu
def test_record_and_lookup_make_no_sync_and_replay_in_a_graph():
    """On a GPU: the step's record and the lookup make no host-device sync,
    and the lookup captured in a CUDA graph (as in the draft routine) replays
    over new rows as it runs eagerly."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    rng = random.Random(3)
    h = TokenHistory(4, 200, 4, dev)
    tokens = torch.tensor([rng.randrange(4) for _ in range(180)], dtype=torch.int32,
                          device=dev)
    qsl = torch.tensor([0, 100, 180], device=dev)
    positions = torch.cat([torch.arange(100), torch.arange(80)]).to(dev)
    # Inputs made before the check: a tensor from a list is a blocking copy.
    step_slots = torch.tensor([2, 0], device=dev)
    bonus_ids = torch.tensor([1, 2], dtype=torch.int32, device=dev)
    drafts = torch.tensor([[1, 2], [3, 0]], device=dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        rows = h.record(step_slots, tokens, positions, bonus_ids, qsl, None)
        eager = h.extend(rows, drafts, 3)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    slots, bonus = rows.slots.clone(), rows.bonus.clone()
    static = drafts.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        h.extend(LookupRows(slots, bonus), static, 3)  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = h.extend(LookupRows(slots, bonus), static, 3)
    graph.replay()
    assert out.tolist() == eager.tolist()
    # Other rows, other drafts: the replay follows.
    slots.copy_(torch.tensor([0, 2])), bonus.copy_(torch.tensor([60, 90]))
    static.copy_(torch.tensor([[0, 1], [2, 3]]))
    graph.replay()
    want = h.extend(LookupRows(slots.clone(), bonus.clone()), static.clone(), 3)
    assert out.tolist() == want.tolist()


def test_a_step_counts_its_looked_up_tokens():
    from types import SimpleNamespace

    from vllm_specextend.drafting.lookup_step import LookupStep
    from vllm_specextend.serving.stats import SpecExtendStats

    step = LookupStep()
    step.cfg = SimpleNamespace(lookup_tokens=5, carry_drafts=None)
    step.stats = SpecExtendStats()
    step._count_looked_up(3, 8)  # lookup off: nothing
    assert step.stats.lookup_tokens == 0
    step.history = TokenHistory(4, 16, 8, CPU)
    step._count_looked_up(3, 8)  # 3 rows, 8 - 3 drafted
    step._count_looked_up(3, 4)  # K lowered to 4 <= 5: all drafted
    assert step.stats.lookup_tokens == 15
