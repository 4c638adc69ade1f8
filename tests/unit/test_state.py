"""SelectionState: slots per request, per-slot selections, lifecycle (no vLLM)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_specextend.retrieval.state import SelectionState


def _state(num_slots=4, top_k=3, live=None):
    return SelectionState(num_slots, top_k, torch.device("cpu"), live_req_ids=live)


def test_slots_are_stable_and_distinct():
    state = _state()
    slots, slots_dev = state.slots_for(["a", "b", "c"])
    assert len(set(slots.tolist())) == 3
    assert torch.equal(slots_dev, torch.from_numpy(slots))
    again, _ = state.slots_for(["c", "a"])
    assert again.tolist() == [slots[2], slots[0]]
    assert "a" in state and "z" not in state
    assert state.num_slots_held == 3


def test_unchanged_batch_reuses_the_mapping():
    state = _state()
    first = state.slots_for(["a", "b"])
    second = state.slots_for(["a", "b"])
    assert first[0] is second[0] and first[1] is second[1]


def test_put_and_selection():
    state = _state(top_k=3)
    slots, slots_dev = state.slots_for(["a", "b"])
    state.put(slots, np.array([64, 96]), np.array([2, 3]),
              torch.tensor([[1, 4, 0], [2, 5, 7]], dtype=torch.int32), slots_dev)
    assert state.selection("a") == (64, [1, 4], 0)
    assert state.selection("b") == (96, [2, 5, 7], 0)
    assert len(state) == 2
    state.steps_since_refresh[slots[0]] += 1
    assert state.selection("a")[2] == 1
    # A streaming window: no chunk ids, nothing written on the device.
    state.put(slots[:1], np.array([128]), np.array([0]))
    assert state.selection("a") == (128, [], 0)
    assert state.selection("b")[1] == [2, 5, 7]


def test_narrower_selections_fill_the_first_columns():
    state = _state(top_k=4)
    slots, slots_dev = state.slots_for(["a"])
    state.put(slots, np.array([32]), np.array([2]),
              torch.tensor([[3, 9]], dtype=torch.int32), slots_dev)
    assert state.selection("a")[1] == [3, 9]


def test_clear_forgets_selections_but_keeps_slots():
    state = _state()
    slots, _ = state.slots_for(["a", "b"])
    state.put(slots, np.array([32, 64]), np.array([0, 0]))
    state.compacted[slots] = True
    state.clear(slots[:1])
    assert state.selection("a") is None and state.selection("b") is not None
    assert not state.compacted[slots[0]] and state.compacted[slots[1]]
    assert state.num_slots_held == 2 and len(state) == 1


def test_release_recycles_slots_and_resets_them():
    state = _state(num_slots=2)
    slots, _ = state.slots_for(["a", "b"])
    state.put(slots, np.array([32, 64]), np.array([0, 0]))
    with pytest.raises(RuntimeError, match="request slots"):
        state.slots_for(["a", "b", "c"])
    state.release(["a", "unknown"])
    new, _ = state.slots_for(["b", "c"])
    assert new[1] == slots[0], "c takes a's slot"
    assert state.selection("c") is None, "a reused slot starts empty"
    assert state.selection("b") == (64, [], 0)


def test_a_released_slot_invalidates_the_cached_mapping():
    state = _state(num_slots=2)
    state.slots_for(["a", "b"])
    state.release(["a"])
    slots, _ = state.slots_for(["b", "c"])
    assert state.slot_of("c") == slots[1] and state.slot_of("a") is None


def test_sweep_drops_only_dead_ids():
    state = _state()
    state.slots_for(["r1", "r2", "r3"])
    assert state.sweep(["r2", "r9"]) == 2
    assert list(state) == ["r2"]
    assert state.sweep([]) == 1 and state.num_slots_held == 0


def test_full_state_sweeps_dead_ids_before_failing():
    live = {"b", "c"}
    state = _state(num_slots=2, live=lambda: live)
    state.slots_for(["a", "b"])  # "a" finished but was never released
    slots, _ = state.slots_for(["b", "c"])
    assert state.slot_of("a") is None and len(set(slots.tolist())) == 2


def test_reset_drops_every_selection():
    state = _state()
    slots, _ = state.slots_for(["a", "b"])
    state.put(slots, np.array([32, 64]), np.array([0, 0]))
    state.reset()
    assert len(state) == 0 and state.num_slots_held == 2
