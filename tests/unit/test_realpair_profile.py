"""The real-pair step profile's breakdown (benchmarks.realpair.profile)."""

from __future__ import annotations

import pytest

from benchmarks.realpair.profile import main, step_profile


def _spans(**busy):
    return {name.replace("_", " "): {"calls": 10, "median_span_ms": ms * 1.2,
                                     "median_busy_ms": ms}
            for name, ms in busy.items()}


def test_step_profile_sums_the_step_scopes_and_leaves_the_rest_to_the_host():
    spans = _spans(forward=2.5, draft=4.0, sample=0.2, bookkeep=0.1,
                   preprocess=9.0)  # not a step scope: left out
    step = step_profile(spans, wall_ms_per_step=8.5)
    assert step["gpu_ms"] == {"forward": 2.5, "draft": 4.0, "sample": 0.2,
                              "bookkeep": 0.1}
    assert step["gpu_ms_sum"] == 6.8
    assert step["host_ms"] == 1.7


def test_step_profile_of_plain_decoding_has_no_draft_and_no_negative_host():
    step = step_profile(_spans(forward=3.0, sample=0.3), wall_ms_per_step=3.1)
    assert "draft" not in step["gpu_ms"]
    assert step["host_ms"] == 0.0


@pytest.mark.parametrize("cell", ["copy", "copy:16384:0", "copy:16384:x", "copy:16384:8 other:16384"])
def test_a_cell_is_one_group_context_and_an_optional_batch(cell, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--cases", "c", "--target", "T", "--mode", "plain", "--cell", cell,
              "--out-dir", "o"])
    assert stop.value.code == 2
    assert "one group:context[:batch]" in capsys.readouterr().err


def test_allocator_counts_read_torchs_counters_and_nothing_without_cuda():
    import types

    from benchmarks.realpair.profile import ALLOCATOR_COUNTS, allocator_counts

    stats = {"num_alloc_retries": 2, "num_device_free": 5, "allocated_bytes.all.current": 9}
    cuda = types.SimpleNamespace(is_available=lambda: True, memory_stats=lambda: stats)
    counts = allocator_counts(types.SimpleNamespace(cuda=cuda))
    assert counts == {"num_alloc_retries": 2, "num_sync_all_streams": 0,
                      "num_device_alloc": 0, "num_device_free": 5}
    assert set(counts) == set(ALLOCATOR_COUNTS)
    no_gpu = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: False))
    assert allocator_counts(no_gpu) == {}
