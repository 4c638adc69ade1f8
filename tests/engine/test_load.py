"""SpecExtend under concurrent load through ``AsyncLLM``, the engine behind
``vllm serve``: streaming and final-only requests of mixed lengths arrive at
once, some are cancelled mid-stream, and the rest must match plain greedy
decoding token for token.

``AsyncLLM`` always runs its engine core in another process, so the drafter's
state is read through the plugin worker's ``specextend_state`` RPC.
"""

from __future__ import annotations

import asyncio
import gc

import pytest
from cpu_engine import engine_kwargs, plain_reference
from test_lossless import CMR

pytestmark = pytest.mark.engine

# (prompt length, max_tokens, how the client reads it); CMR has min_context 256.
# Cancelled and aborted requests ask for far more tokens than they get: if the
# engine did not stop them, they would still be running when the load is over.
REQUESTS = [
    (1500, 64, "stream"), (1400, 48, "final"), (1300, 700, "cancel"),
    (1200, 40, "stream"), (1100, 900, "abort"), (1000, 56, "final"),
    (900, 1100, "cancel"), (800, 32, "stream"), (700, 1300, "abort"),
    (500, 48, "final"), (300, 24, "stream"), (90, 40, "final"),
]
STOP_AFTER = 8  # tokens a cancelled or aborted request streams first
REFERENCE_TOKENS = 64  # covers every completed request


@pytest.fixture(scope="module")
def prompts(long_prompts):
    return long_prompts([n for n, _, _ in REQUESTS])


@pytest.fixture(scope="module")
def references(tiny_target, prompts):
    return plain_reference(tiny_target, prompts, REFERENCE_TOKENS)


def make_async_llm(target, draft):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(target, draft, CMR)))


async def worker_state(engine) -> tuple[list[str], int, dict]:
    """(ids of the requests the model runner holds, requests in the drafter's
    selection store, drafter statistics)."""

    (state,) = await engine.collective_rpc("specextend_state")
    return state["live_requests"], state["tracked_requests"], state["stats"]


async def run_request(engine, req_id, prompt, max_tokens, kind, tokens: list[int]):
    """Read one request as ``kind`` says, collecting its tokens; return the
    finish reason."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0, ignore_eos=True,
        output_kind=(RequestOutputKind.FINAL_ONLY if kind == "final"
                     else RequestOutputKind.DELTA))
    reason = None
    async for out in engine.generate({"prompt_token_ids": prompt}, params, req_id):
        tokens += out.outputs[0].token_ids
        reason = out.outputs[0].finish_reason
        if len(tokens) >= STOP_AFTER and reason is None:
            if kind == "cancel":
                # A client that goes away: its task is cancelled mid-stream.
                asyncio.current_task().cancel()
            elif kind == "abort":
                await engine.abort(req_id)
    return reason


async def load(engine, prompts):
    tokens = [[] for _ in REQUESTS]
    tasks = [asyncio.create_task(run_request(engine, f"r{i}", p, n, kind, tokens[i]))
             for i, (p, (_, n, kind)) in enumerate(zip(prompts, REQUESTS, strict=True))]
    reasons = await asyncio.gather(*tasks, return_exceptions=True)
    # Finished and aborted ids reach the worker with the next step; the probe
    # itself stays in the runner until the step after it.
    await run_request(engine, "probe", prompts[-1][:16], 2, "final", [])
    return reasons, tokens, await worker_state(engine)


def test_concurrent_mixed_load(tiny_target, tiny_draft, prompts, references):
    engine = make_async_llm(tiny_target, tiny_draft)
    try:
        reasons, tokens, (running, tracked, stats) = asyncio.run(load(engine, prompts))
    finally:
        engine.shutdown()
        del engine
        gc.collect()

    for (_, max_tokens, kind), reason, out, ref in zip(
            REQUESTS, reasons, tokens, references, strict=True):
        if kind == "cancel":
            assert isinstance(reason, asyncio.CancelledError), repr(reason)
        else:
            assert reason == ("abort" if kind == "abort" else "length"), repr(reason)
        if kind in ("cancel", "abort"):
            # How far past STOP_AFTER a stopped request got depends on how fast
            # this loop read (vLLM merges the deltas it has not read yet).
            assert STOP_AFTER <= len(out) < max_tokens
            checked = min(len(out), REFERENCE_TOKENS)
            assert out[:checked] == ref[:checked]
        else:
            assert out == ref[:max_tokens]
    # The engine suffixes request ids.
    assert all(r.startswith("probe") for r in running), "the stopped requests ended"
    assert tracked == 0, "finished, cancelled and aborted requests leave no state"
    assert stats["retrievals"] > 0
    assert stats["view_rows"] > 0
    assert stats["draft_context_tokens"] < stats["full_context_tokens"]
