"""``carry.CarrySignal``: which rows' lookups held, per request slot, and the
host's copy of it a step or two late (CPU: the copy lands at once, so one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_specextend.drafting.carry import CarrySignal

CPU = torch.device("cpu")
K = 12


def _step(signal, slots, rejected, drafted):
    """One uniform decode step as the proposer runs it: read, update, propose."""
    signal.read()
    signal.update(torch.tensor(slots), K, torch.tensor(rejected, dtype=torch.int32))
    carries = signal.carries(np.asarray(slots))
    signal.proposed(torch.tensor(slots), drafted)
    return carries


def test_a_row_carries_once_a_looked_up_token_held():
    signal = CarrySignal(4, CPU)
    # Slot 2 drafted 3: 4 accepted (12 - 8 rejected) is one looked-up token.
    signal.proposed(torch.tensor([2]), 3)
    assert not _step(signal, [2], [8], 3), "the host learns it one step late"
    assert signal.carried.tolist() == [False, False, True, False]
    # The next step reads it; this step's verification (3 accepted: the
    # drafts only) is what the step after reads.
    assert _step(signal, [2], [9], 1)
    assert not _step(signal, [2], [0], 3)
    assert _step(signal, [2], [0], 1)


def test_only_a_lookup_past_the_rows_own_drafts_counts():
    signal = CarrySignal(3, CPU)
    signal.proposed(torch.tensor([0, 1]), 1)  # both drafted 1 (carried)
    _step(signal, [0, 1], [11, 10], 1)  # slot 0 accepted 1: its draft only
    assert signal.carried[:2].tolist() == [False, True]


def test_a_batch_carries_only_where_every_row_does():
    signal = CarrySignal(3, CPU)
    signal.proposed(torch.tensor([0, 1, 2]), 3)
    _step(signal, [0, 1, 2], [0, 0, 12], 3)
    signal.read()
    assert signal.carries(np.array([0, 1])) and not signal.carries(np.array([0, 2]))
    assert not signal.carries(np.array([], dtype=np.int64))


def test_a_slot_handed_on_starts_over():
    signal = CarrySignal(2, CPU)
    _step(signal, [1], [0], 3)
    signal.read()
    assert signal.carries(np.array([1]))
    signal.forget(1)
    assert not signal.carries(np.array([1]))
    assert not signal.carried[1]
    # Its first verification before a proposal of its own carries nothing,
    # all accepted or not; after one, it counts.
    signal.update(torch.tensor([1]), K, torch.tensor([0], dtype=torch.int32))
    assert not signal.carried[1]
    signal.proposed(torch.tensor([1]), 3)
    signal.update(torch.tensor([1]), K, torch.tensor([0], dtype=torch.int32))
    assert signal.carried[1]


class _Event:
    """A CUDA event's stand-in: lands when the test says so."""

    def __init__(self):
        self.landed = True

    def record(self):
        self.landed = False

    def query(self):
        return self.landed


def _with_events(signal):
    signal._events = [_Event(), _Event()]
    return signal._events


def test_the_host_reads_the_newest_copy_that_landed():
    signal = CarrySignal(2, CPU)
    events = _with_events(signal)
    signal.proposed(torch.tensor([0, 1]), 3)
    # Step 1: slot 0's lookup held, slot 1's did not; its copy lands late.
    signal.update(torch.tensor([0, 1]), K, torch.tensor([0, 12], dtype=torch.int32))
    signal.read()
    assert signal.known.tolist() == [False, False], "nothing landed yet"
    # Step 2: both held; step 1's copy has landed, step 2's not.
    events[0].landed = True
    signal.update(torch.tensor([0, 1]), K, torch.tensor([0, 0], dtype=torch.int32))
    signal.read()
    assert signal.known.tolist() == [True, False]
    # The host a step behind: both copies land before the next read, the
    # newer one counts.
    events[1].landed = True
    signal.read()
    assert signal.known.tolist() == [True, True]


def test_a_forgotten_slot_ignores_copies_published_before():
    signal = CarrySignal(2, CPU)
    events = _with_events(signal)
    signal.proposed(torch.tensor([0, 1]), 3)
    signal.update(torch.tensor([0, 1]), K, torch.tensor([0, 0], dtype=torch.int32))
    signal.forget(1)  # slot 1's request finished, a new one took it
    events[0].landed = True
    signal.read()
    assert signal.known.tolist() == [True, False]


@pytest.mark.gpu
def test_the_signal_makes_no_sync():
    """On a GPU: a step's read, update, proposal and a slot handed on queue
    work without a host-device sync (``tensor[i] = False`` would sync)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dev = torch.device("cuda")
    signal = CarrySignal(4, dev)
    # Inputs made before the check: a tensor from a list is a blocking copy.
    slots = torch.tensor([2, 0], device=dev)
    rejected = torch.tensor([0, 12], dtype=torch.int32, device=dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            signal.read()
            signal.update(slots, K, rejected)
            signal.carries(np.array([2, 0]))
            signal.proposed(slots, 3)
        signal.forget(1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    signal.read()
    assert signal.known.tolist() == [False, False, True, False]


def test_a_stricter_rule_needs_more_looked_up_tokens():
    """SPECEXTEND_CARRY_AFTER: 4 looked-up tokens accepted, or every proposal."""
    slots = torch.tensor([0, 1, 2])
    rejected = torch.tensor([0, 2, 5], dtype=torch.int32)  # 12, 10, 7 accepted
    for after, want in [(1, [True, True, True]), (4, [True, True, True]),
                        (5, [True, True, False]), (None, [True, False, False])]:
        signal = CarrySignal(3, CPU, after)
        signal.proposed(slots, 3)
        signal.update(slots, K, rejected)
        assert signal.carried.tolist() == want, after


@pytest.mark.parametrize("value, want", [(None, 1), ("1", 1), ("4", 4), ("all", None)])
def test_carry_after_reads_the_environment(monkeypatch, value, want):
    from vllm_specextend.drafting.carry import carry_after

    monkeypatch.delenv("SPECEXTEND_CARRY_AFTER", raising=False)
    if value is not None:
        monkeypatch.setenv("SPECEXTEND_CARRY_AFTER", value)
    assert carry_after() == want


@pytest.mark.parametrize("value", ["0", "-1", "some", "1.5"])
def test_carry_after_refuses_what_is_not_a_count(monkeypatch, value):
    from vllm_specextend.drafting.carry import carry_after

    monkeypatch.setenv("SPECEXTEND_CARRY_AFTER", value)
    with pytest.raises(ValueError, match="SPECEXTEND_CARRY_AFTER.*1 or more"):
        carry_after()
