"""A draft with 256 positions drafts for ~2K-token prompts (CPU, fp32).

vLLM 0.26 alone turns drafting off once a batch's context exceeds the draft's
max_model_len. With ``--spec-extend`` and compacted positions the draft sees a
working set of under 256 contiguous positions and keeps drafting, while greedy
output stays identical to plain decoding. The scratch KV that compaction adds
comes out of the same ``kv_cache_memory_bytes`` as vLLM's own KV cache.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.engine

# Working set: 32 + 2*32 + 64 + 2*(3+1) + 32 + 2*3 = 206 <= 256 positions.
FITS = {"chunk_size": 32, "top_k": 2, "sink_tokens": 32, "recent_tokens": 64,
        "retrieve_every": 2, "min_context": 2048}
K = 3
LENGTHS = [1900, 1500, 1700]  # every prompt exceeds the draft's 256 positions
MAX_TOKENS = 40


def kv_footprint(llm):
    """The engine's KV budget as the worker reported it, the pool's block count
    and the bytes of every KV tensor the runner holds (pool and scratch)."""
    core = llm.llm_engine.engine_core.engine_core
    runner = core.model_executor.driver_worker.worker.model_runner
    tensors = {t.data_ptr(): t for t in runner.kv_caches}
    return dict(
        budget=core.available_gpu_memory_for_kv_cache,
        num_blocks=core.vllm_config.cache_config.num_gpu_blocks,
        kv_bytes=sum(t.numel() * t.element_size() for t in tensors.values()),
        requested=core.vllm_config.cache_config.kv_cache_memory_bytes,
    )


def scratch_footprint(llm, proposer):
    """``kv_footprint`` with the scratch bytes reserved and allocated."""
    from benchmarks.harness.drafter import compactor

    return dict(
        footprint=kv_footprint(llm),
        scratch_bytes=proposer.scratch_bytes(),
        scratch_allocated=compactor(proposer).allocated_bytes(),
    )


def pool_fills(footprint, pool_bytes):
    """vLLM's pool is the most whole blocks that fit the reported budget."""
    num_blocks = footprint["num_blocks"]
    block_bytes = pool_bytes // num_blocks
    return (
        block_bytes * num_blocks == pool_bytes
        and num_blocks == footprint["budget"] // block_bytes
    )


def test_vllm_alone_stops_drafting(tiny_target, tiny_short_draft, prompts,
                                   plain_outputs):
    """The baseline: vLLM 0.26 runs, but its draft model never runs for these
    prompts. ``_input_fits_in_drafter`` fails (max_seq_len + K > 256), so the
    runner schedules K placeholder drafts of token 0 per step instead (they
    still count as drafts; measured: 117 drafts, 0 accepted tokens)."""
    from cpu_engine import counter, generate, make_llm, shutdown

    from benchmarks.harness.drafter import drafter

    llm = make_llm(tiny_target, tiny_short_draft, num_spec_tokens=K)
    proposer = drafter(llm)
    calls = []
    original = proposer.propose
    proposer.propose = lambda *a, **kw: calls.append(1) or original(*a, **kw)
    outputs = generate(llm, prompts, max_tokens=MAX_TOKENS)
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    footprint = kv_footprint(llm)
    shutdown(llm)

    assert outputs == plain_outputs
    assert not calls, "the draft model never runs"
    assert accepted == 0
    # What the compacted runs compare against: the whole budget is the pool.
    assert footprint["budget"] == footprint["requested"]
    assert pool_fills(footprint, footprint["kv_bytes"])


def run_compacted(target, draft, prompts):
    from cpu_engine import counter, generate, make_llm, shutdown

    from benchmarks.harness.drafter import (
        compactor,
        drafter,
        model_runner,
        selection_store,
        stats,
    )

    llm = make_llm(target, draft, FITS, num_spec_tokens=K)
    proposer = drafter(llm)
    proposed = []
    original = proposer.propose
    proposer.propose = lambda *a, **kw: proposed.append(original(*a, **kw)) or proposed[-1]
    outputs = generate(llm, prompts, max_tokens=MAX_TOKENS)
    result = dict(
        outputs=outputs,
        proposed=torch.cat(proposed).flatten() if proposed else torch.zeros(0),
        accepted=counter(llm, "vllm:spec_decode_num_accepted_tokens"),
        draft_tokens=counter(llm, "vllm:spec_decode_num_draft_tokens"),
        stats=stats(proposer),
        compact=compactor(proposer) is not None,
        **scratch_footprint(llm, proposer),
    )
    generate(llm, [prompts[0][:16]], max_tokens=2)  # delivers the finished ids
    # Slots (and so scratch runs) held by requests the runner has let go of.
    live = set(model_runner(llm).requests)
    result["scratch_held"] = len(set(selection_store(proposer)) - live)
    shutdown(llm)
    return result


def assert_scratch_within_budget(run):
    """The scratch comes out of kv_cache_memory_bytes: the worker reports the
    budget less the scratch, vLLM's pool fills what is left, and pool plus
    scratch stay within the requested bytes (plain vLLM: pool == budget)."""
    footprint, scratch = run["footprint"], run["scratch_bytes"]
    assert scratch > 0
    assert footprint["budget"] == footprint["requested"] - scratch
    # On CPU the kernel block is the scheduler's block: the reservation is exact.
    assert run["scratch_allocated"] == scratch
    pool = footprint["kv_bytes"] - scratch
    assert pool_fills(footprint, pool)
    assert footprint["kv_bytes"] <= footprint["requested"]


def test_compacted_positions_draft_and_stay_lossless(tiny_target, tiny_short_draft,
                                                     prompts, plain_outputs):
    run = run_compacted(tiny_target, tiny_short_draft, prompts)
    stats = run["stats"]

    assert run["compact"], "auto: the draft has fewer positions than the target"
    assert run["outputs"] == plain_outputs
    assert (run["proposed"] != 0).any(), "the draft model runs"
    assert stats["view_rows"] == stats["decode_rows"] > 0
    assert stats["compactions"] > 0 and stats["retrievals"] > 0
    assert run["scratch_held"] == 0, "finished requests give their scratch back"
    assert_scratch_within_budget(run)


def test_short_copy_of_the_target_is_accepted(tiny_target, tiny_short_target,
                                              prompts, plain_outputs):
    """The target's own weights with 256 positions, drafting through compacted
    views, gets drafts accepted (measured 10 of 321 draft tokens: a random
    2-layer model's next token depends on context the 206-token working set
    drops; the unrelated ``tiny_short_draft`` gets 0)."""
    run = run_compacted(tiny_target, tiny_short_target, prompts)
    assert run["outputs"] == plain_outputs
    assert run["draft_tokens"] > 0 and run["accepted"] > 0
    assert_scratch_within_budget(run)


def test_budget_without_room_for_the_scratch_fails_at_startup(tiny_target,
                                                              tiny_short_draft):
    """16 MiB of kv_cache_memory_bytes cannot hold 256 requests x 96 tokens of
    scratch (24 MiB): startup fails naming the knobs instead of allocating past
    the budget."""
    from cpu_engine import make_llm

    from vllm_specextend.config import SpecExtendConfigError

    with pytest.raises(SpecExtendConfigError, match=r"max_num_seqs=256 .*top_k=2"):
        make_llm(tiny_target, tiny_short_draft, FITS, num_spec_tokens=K,
                 kv_cache_memory_bytes=16 << 20, max_num_seqs=256)
