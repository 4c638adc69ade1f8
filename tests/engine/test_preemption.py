"""Preemption and recompute: the plugin's per-request state leaves with a
preempted request and is built again when it comes back (CPU, fp32,
in-process engines).

A KV cache too small for the batch makes vLLM preempt running requests: their
blocks are freed and they are recomputed from the prompt later, under the same
request id. The worker reports each preempted id to the proposer, which gives
its slot back: the selection, and under compacted positions the scratch run the
slot names. A resumed request takes a slot as a new one does, and retrieval
(and compaction) build its state again. Each setup (a draft of full length,
compacted positions, the captured routine's code on static buffers) must show:
vLLM preempted; a request was preempted while holding a selection (compacted:
and a scratch run) and held one again at its end; greedy output equals plain
decoding; once the last request is done, no request holds a slot or a
selection.
"""

from __future__ import annotations

import pytest
from cpu_engine import counter, generate, make_llm, shutdown
from test_compaction import FITS
from test_lossless import (
    CMR,
    plain_outputs,  # noqa: F401 - the fixture, for these prompts
    prompts,  # noqa: F401 - the fixture: test_lossless's batch
)

from benchmarks.harness.drafter import (
    ReleaseRecorder,
    compactor,
    drafter,
    graphs_captured,
    selection_store,
    stats,
)

pytestmark = pytest.mark.engine

# The draft's 3 layers (tiny_draft) at 1.5 KiB of fp32 KV per token: 4 MiB is
# room for about one and a half of the long requests.
FULL_DRAFT_KV = 4 << 20
# The target's and tiny_short_draft's 2 layers each: 2 KiB per token, and 96
# tokens of scratch per request slot. vLLM admits a prompt only whole: a pool of
# 85 blocks takes the first three (82 blocks), and their decoding outgrows it.
COMPACTED_KV = 85 * 32 * 2048 + 4 * 96 * 1024

SETUPS = {
    "full-draft": dict(draft="tiny_draft", spec_extend=CMR,
                       kv_cache_memory_bytes=FULL_DRAFT_KV),
    "compacted": dict(draft="tiny_short_draft", spec_extend=FITS,
                      num_spec_tokens=3, kv_cache_memory_bytes=COMPACTED_KV,
                      max_num_seqs=4),
    "static-graph": dict(draft="tiny_draft",
                         spec_extend={**CMR, "draft_graph": "static"},
                         num_spec_tokens=3, kv_cache_memory_bytes=FULL_DRAFT_KV),
}


def deliver_finished(llm) -> None:
    """One engine step with no request: the scheduler hands the last finished
    ids to the worker, as a server's engine loop does when its batch empties."""
    llm.llm_engine.step()


@pytest.mark.parametrize("setup", list(SETUPS))
def test_state_cycles_through_preemption(request, tiny_target, prompts,  # noqa: F811
                                         plain_outputs, setup):  # noqa: F811
    kwargs = dict(SETUPS[setup])
    draft = request.getfixturevalue(kwargs.pop("draft"))
    llm = make_llm(tiny_target, draft, kwargs.pop("spec_extend"), **kwargs)
    proposer = drafter(llm)
    recorder = ReleaseRecorder(proposer)
    outputs = generate(llm, prompts)
    deliver_finished(llm)
    preemptions = counter(llm, "vllm:num_preemptions")
    counts = stats(proposer)
    store = selection_store(proposer)
    left = dict(slots=list(store), selections=len(store))
    compacting = compactor(proposer) is not None
    captured = graphs_captured(proposer)
    shutdown(llm)

    assert preemptions > 0, "the KV cache is small enough for vLLM to preempt"
    assert outputs == plain_outputs
    assert counts["view_rows"] > 0
    # Preempted while holding a selection (and its scratch copies), and holding
    # one again when it finished: dropped with the request, built again after.
    cycled = [
        req_id for req_id, held in recorder.resumed().items()
        if any(h.selection and (h.compacted or not compacting) for h in held[:-1])
        and held[-1].selection and (held[-1].compacted or not compacting)
    ]
    assert cycled, recorder.releases
    # Every request is done: no slot, no selection, and the gauges say so.
    assert left == dict(slots=[], selections=0)
    assert counts["tracked_requests"] == counts["request_slots"] == 0
    if setup == "compacted":
        assert compacting and counts["compactions"] > len(prompts)
    if setup == "static-graph":
        assert captured and counts["graph_steps"] > 0, "the routine drafted"
