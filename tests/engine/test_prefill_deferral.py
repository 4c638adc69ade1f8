"""Draft passes over prompt chunks kept for a later step draft exactly as in
their own step (``deferral.py``; CPU, fp32, in-process engines).

A small token budget splits every prompt into chunks, 128 tokens per request
and step, so that several requests prefill side by side and most early steps
sample nothing: those steps keep their draft pass, and the first step that
drafts runs the kept ones first. With deferral on and off, every proposal of
every request must be the same, token for token, and greedy output must equal
plain decoding; with prefix caching on (the batch holds a prompt that shares
1,200 tokens with another, scheduled while that one is still prefilling) and
off. A request aborted mid-prompt has its kept passes run when the worker
learns it left (as a preempted one's), and a request that then hits its
cached blocks drafts as without deferral. A control that drops the
kept passes instead of running them must draft differently: the proposals do
see the draft KV those passes write.
"""

from __future__ import annotations

import pytest
from cpu_engine import counter, generate, make_llm, shutdown
from test_lossless import CMR

from benchmarks.harness.drafter import DraftRecorder, drafter, stats

pytestmark = pytest.mark.engine

LENGTHS = [1500, 1000, 700]
MAX_TOKENS = 32
# Three requests a step, 128 prompt tokens each: the first five steps sample
# nothing; the fourth request waits for room and then shares 1,200 tokens
# with the first, which is still prefilling.
CHUNKED = dict(max_num_batched_tokens=384, long_prefill_token_threshold=128)
FULL_PASS = {"draft_prompt_pool": None}
"""Deferral moves the draft's passes over prompt chunks; a pooled prompt
drops them (here "auto" would step aside anyway: 384 tokens a step)."""


@pytest.fixture(scope="module")
def prompts(long_prompts):
    batch = long_prompts(LENGTHS)
    batch.append(batch[0][:1200] + long_prompts([200], start=7)[0])
    return batch


_RUNS: dict[tuple, dict] = {}


def _run(target, draft, prompts, defer, drop_kept=False, **overrides):
    """One engine's run; the same run asked for again (the control's
    deferral-off run is ``test_kept_passes_draft_as_in_their_step[True]``'s)
    is read from the first, not run twice."""
    key = (target, draft, tuple(map(tuple, prompts)), defer, drop_kept,
           tuple(sorted(overrides.items())))
    if key not in _RUNS:
        _RUNS[key] = _engine_run(target, draft, prompts, defer, drop_kept, **overrides)
    return _RUNS[key]


def _engine_run(target, draft, prompts, defer, drop_kept=False, **overrides):
    llm = make_llm(target, draft, {**CMR, "defer_prefill_draft": defer, **FULL_PASS},
                   **CHUNKED, **overrides)
    proposer = drafter(llm)
    recorder = DraftRecorder(llm)
    recorder.enabled = True
    if drop_kept:
        proposer._run_kept_passes = proposer.deferral.take
    outputs = generate(llm, prompts, max_tokens=MAX_TOKENS)
    run = dict(outputs=outputs, proposals=list(recorder.proposals.values()),
               stats=stats(proposer), kept_left=len(proposer.deferral),
               prefix_hits=counter(llm, "vllm:prefix_cache_hits"))
    shutdown(llm)
    return run


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_kept_passes_draft_as_in_their_step(tiny_target, tiny_draft, prompts,
                                             plain_outputs, prefix_caching):
    off = _run(tiny_target, tiny_draft, prompts, False,
               enable_prefix_caching=prefix_caching)
    on = _run(tiny_target, tiny_draft, prompts, True,
              enable_prefix_caching=prefix_caching)

    assert off["stats"]["deferred_prefill_passes"] == 0
    assert off["stats"]["split_prefill_steps"] == 0
    assert on["stats"]["deferred_prefill_passes"] > 0, "steps kept their pass"
    # Steps where a request decodes while another still prefills: cut in two.
    assert on["stats"]["split_prefill_steps"] > 0, "steps kept their chunks' pass"
    assert on["kept_left"] == 0, "every kept pass ran"
    assert len(on["proposals"]) == len(prompts)
    assert on["proposals"] == off["proposals"], "the same drafts, step by step"
    assert on["outputs"] == off["outputs"] == plain_outputs
    assert (on["prefix_hits"] > 0) == prefix_caching


def _abort_then_reuse(target, draft, prompt, defer):
    """Three chunks of ``prompt`` (their passes kept), abort it, then the same
    prompt again: it hits the aborted request's cached blocks."""
    from vllm import SamplingParams

    llm = make_llm(target, draft, {**CMR, "defer_prefill_draft": defer, **FULL_PASS},
                   **CHUNKED, enable_prefix_caching=True)
    engine, proposer = llm.llm_engine, drafter(llm)
    engine.add_request("aborted", {"prompt_token_ids": prompt},
                       SamplingParams(max_tokens=8, temperature=0))
    for _ in range(3):
        engine.step()
    kept = len(proposer.deferral)
    engine.abort_request(["aborted"])
    engine.step()  # the finished id reaches the worker
    after_abort = dict(kept=len(proposer.deferral), ran=stats(proposer)[
        "deferred_prefill_passes"])
    recorder = DraftRecorder(llm)
    recorder.enabled = True
    (out,) = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
    outputs, hits = [list(out.outputs[0].token_ids)], out.num_cached_tokens
    shutdown(llm)
    return dict(kept=kept, after_abort=after_abort, outputs=outputs, hits=hits,
                proposals=list(recorder.proposals.values()))


def test_kept_passes_of_an_aborted_request_run_at_once(tiny_target, tiny_draft,
                                                       prompts, plain_outputs):
    # Its blocks stay in the prefix cache: a later request reads the draft KV
    # the kept passes write.
    off = _abort_then_reuse(tiny_target, tiny_draft, prompts[0], False)
    on = _abort_then_reuse(tiny_target, tiny_draft, prompts[0], True)

    assert on["kept"] == 3 and off["kept"] == 0
    assert on["after_abort"] == dict(kept=0, ran=3), "run when the request left"
    assert on["hits"] > 0, "the second request hit the aborted one's blocks"
    assert on["proposals"] == off["proposals"]
    assert on["outputs"] == off["outputs"] == plain_outputs[:1]


def test_dropping_kept_passes_changes_the_drafts(tiny_target, tiny_draft, prompts):
    # The control: the comparison above can fail. (Prefix caching on, vLLM's
    # default, as in the comparison's first case.)
    off = _run(tiny_target, tiny_draft, prompts, False, enable_prefix_caching=True)
    dropped = _run(tiny_target, tiny_draft, prompts, True, drop_kept=True,
                   enable_prefix_caching=True)

    assert dropped["stats"]["deferred_prefill_passes"] == 0
    assert dropped["proposals"] != off["proposals"]
