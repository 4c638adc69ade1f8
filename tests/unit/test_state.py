"""SelectionStore lifecycle (no vLLM)."""

from __future__ import annotations

import torch

from vllm_specextend.state import RequestSelection, SelectionStore


def test_request_selection_defaults():
    entry = RequestSelection(window_start=64)
    assert entry.window_start == 64
    assert entry.num_selected == 0
    assert entry.selected_chunks is None
    assert entry.steps_since_refresh == 0


def test_put_get_contains_len():
    store = SelectionStore()
    assert len(store) == 0
    assert "a" not in store
    assert store.get("a") is None
    a = RequestSelection(window_start=32, num_selected=2,
                         selected_chunks=torch.tensor([3, 5], dtype=torch.int32))
    store.put("a", a)
    assert len(store) == 1
    assert "a" in store
    assert store.get("a") is a
    store.put("b", RequestSelection(window_start=96))
    assert len(store) == 2
    assert "b" in store and "c" not in store


def test_put_replaces_entry():
    store = SelectionStore()
    first = RequestSelection(window_start=32)
    second = RequestSelection(window_start=64)
    store.put("a", first)
    store.put("a", second)
    assert len(store) == 1
    assert store.get("a") is second


def test_entries_are_mutable_in_place():
    store = SelectionStore()
    store.put("a", RequestSelection(window_start=32))
    store.get("a").steps_since_refresh += 1
    assert store.get("a").steps_since_refresh == 1


def test_drop_ignores_unknown_ids():
    store = SelectionStore()
    for rid in "abc":
        store.put(rid, RequestSelection(window_start=0))
    store.drop(["b", "zzz"])
    assert len(store) == 2
    assert "b" not in store and store.get("b") is None
    assert "a" in store and "c" in store
    store.drop([])
    store.drop(iter(["a"]))  # any iterable
    assert len(store) == 1
    store.drop({"c"})
    assert len(store) == 0


def test_sweep_drops_only_dead_ids():
    store = SelectionStore()
    for rid in ("r1", "r2", "r3", "r4"):
        store.put(rid, RequestSelection(window_start=0))
    live = {"r2": object(), "r4": object(), "r9": object()}
    assert store.sweep(live.keys()) == 2
    assert len(store) == 2
    assert "r2" in store and "r4" in store
    assert "r1" not in store and "r3" not in store
    assert "r9" not in store  # sweep never creates entries
    assert store.sweep(["r2", "r4"]) == 0
    assert store.sweep(iter([])) == 2
    assert len(store) == 0
    assert store.sweep([]) == 0


def test_full_lifecycle_reuse_id():
    store = SelectionStore()
    store.put("req", RequestSelection(window_start=32, num_selected=1))
    store.drop(["req"])  # finished
    assert store.get("req") is None
    store.put("req", RequestSelection(window_start=128))  # reused id
    assert store.get("req").window_start == 128
    assert store.get("req").num_selected == 0
