"""The staging ring hands out host buffers without waiting for the GPU.

Why: ``HostStaging`` once waited (``cudaEventSynchronize``, which torch's
sync debug mode does not see) when the copy out of a buffer two steps back
was still queued, as it is when kept prompt passes queue tens of ms of draft
work ahead of a step's copy; a host that waits loses its lead, and under
async scheduling a step's tokens go out only once the host queued the next
step. Fake events stand in for CUDA's: the ring's choices, not timing.
"""

from __future__ import annotations

import torch

from vllm_specextend.retrieval.staging import PinnedRing


class FakeEvent:
    """A copy that runs when the test says so."""

    made: list[FakeEvent] = []

    def __init__(self):
        self.done = False
        self.waited = False
        FakeEvent.made.append(self)

    def record(self):
        pass

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True
        self.done = True


def _ring(max_buffers=8):
    FakeEvent.made = []
    return PinnedRing(4, pin=False, new_event=FakeEvent, max_buffers=max_buffers)


def _turn(ring, value):
    buf = ring.take()
    buf.fill_(value)
    ring.copied()
    return buf


def test_a_ring_whose_copies_ran_reuses_its_two_buffers():
    ring = _ring()
    seen = []
    for step in range(6):
        seen.append(_turn(ring, step).data_ptr())
        FakeEvent.made[-1].done = True
    assert len(ring.buffers) == 2 and ring.grown == 0 and ring.waits == 0
    assert len(set(seen)) == 2 and seen[0] == seen[2] == seen[4]


def test_a_queued_copy_grows_the_ring_instead_of_waiting():
    ring = _ring()
    written = [_turn(ring, step) for step in range(5)]  # no copy has run
    assert ring.waits == 0 and not any(e.waited for e in FakeEvent.made)
    assert ring.grown == 3 and len(ring.buffers) == 5
    # No buffer was handed out twice while its copy was queued: each still
    # holds the value written for its own step.
    assert [int(b[0]) for b in written] == [0, 1, 2, 3, 4]
    assert len({b.data_ptr() for b in written}) == 5
    # Once the copies ran, the grown ring turns over without growing.
    for e in FakeEvent.made:
        e.done = True
    for step in range(10):
        _turn(ring, step)
        FakeEvent.made[-1].done = True
    assert ring.grown == 3 and len(ring.buffers) == 5


def test_a_full_ring_waits_for_the_copy_it_reuses():
    ring = _ring(max_buffers=3)
    for step in range(4):
        _turn(ring, step)
    assert len(ring.buffers) == 3 and ring.grown == 1
    assert ring.waits == 1 and sum(e.waited for e in FakeEvent.made) == 1


def test_resize_keeps_the_ring_length_and_forgets_old_copies():
    ring = _ring()
    for step in range(4):
        _turn(ring, step)
    ring.resize(16)
    assert len(ring.buffers) == 4
    assert all(b.numel() == 16 for b in ring.buffers)
    before = ring.grown
    _turn(ring, 0)  # the new buffers have no queued copy
    assert ring.grown == before and ring.waits == 0


def test_staging_on_cpu_hands_back_the_arrays():
    import numpy as np

    from vllm_specextend.retrieval.staging import HostStaging

    staging = HostStaging(torch.device("cpu"))
    staging.begin_step(8)
    a, b = staging.to_device(np.array([1, 2]), np.array([[3], [4]]))
    assert a.tolist() == [1, 2] and b.tolist() == [[3], [4]]


def test_a_wait_is_counted_and_the_values_arrive():
    """The ring inside ``HostStaging`` (on CPU with fake events, as on a GPU
    with CUDA's): a step that had to wait counts in ``staging_waits``, the
    metric that says the host ran that far ahead."""
    import numpy as np

    from vllm_specextend.retrieval.staging import HostStaging
    from vllm_specextend.serving.stats import SpecExtendStats

    stats = SpecExtendStats()
    staging = HostStaging(torch.device("cpu"), stats=stats)
    FakeEvent.made = []
    staging._ring = PinnedRing(4, pin=False, new_event=FakeEvent, max_buffers=2)
    staging._gpu, staging._dev = True, torch.empty(4, dtype=torch.int64)
    for step in range(3):  # no copy ever runs: the third step must wait
        staging.begin_step(3)
        (out,) = staging.to_device(np.array([step, step + 1, step + 2]))
        assert out.tolist() == [step, step + 1, step + 2]
    assert stats.staging_waits == 1 and staging._ring.waits == 1
