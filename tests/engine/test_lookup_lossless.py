"""Draft, then look up (``lookup_tokens``): greedy output stays plain
decoding's, looked-up tokens are accepted, and the history holds each
request's tokens (CPU engines, in process).

The draft is the target's own checkpoint, so its r = K - lookup_tokens
drafts are accepted and the positions after them, which only the lookup
fills, show whether the lookup proposed what the target then wrote. The
prompts repeat a text and the tiny model's greedy output falls into loops,
so the request's own context holds the continuation. The captured routine's
code (``draft_graph: "static"``, where the lookup runs inside the body)
must propose what the eager path proposes, step for step.
"""

from __future__ import annotations

import pytest
from cpu_engine import generate, make_llm, shutdown
from test_lossless import SMALL_BUDGET
from test_prefill_deferral import CHUNKED

from benchmarks.harness.drafter import DraftRecorder, drafter, stats
from benchmarks.realpair.run import plugin_counters, resolved_keys

pytestmark = pytest.mark.engine

LENGTHS = [700, 300, 500]
MAX_TOKENS = 64
K, LOOKUP = 4, 2
CMR = {"top_k": 4, "recent_tokens": 64, "min_context": 256}


@pytest.fixture(scope="module")
def prompts(long_prompts):
    texts = long_prompts(LENGTHS)
    # Each prompt is its first half twice; the last one shares the first's
    # first 400 tokens: a prefix-cache hit, whose history is filled from the
    # runner's host copy.
    repeated = [t[: len(t) // 2] * 2 for t in texts]
    return repeated + [repeated[0][:400] + texts[1][:150]]


@pytest.fixture(scope="module")
def plain_outputs(tiny_target, prompts):
    from cpu_engine import plain_reference

    return plain_reference(tiny_target, prompts, MAX_TOKENS)


def _accepted_per_pos(llm) -> list[int]:
    return next(m.values for m in llm.get_metrics()
                if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos")


def _run(target, prompts, lookup_tokens, draft_graph, pool=None, carry=None,
         **engine):
    llm = make_llm(target, target, {**CMR, "lookup_tokens": lookup_tokens,
                                    "draft_graph": draft_graph,
                                    "draft_prompt_pool": pool,
                                    "carry_drafts": carry},
                   num_spec_tokens=K, enable_prefix_caching=True, **engine)
    proposer = drafter(llm)
    history = {}  # req_id -> its history row after its last step
    record = proposer._record_tokens

    def recording(step, cad, *args):
        record(step, cad, *args)
        if proposer.history is not None:
            for req_id in proposer.runner.input_batch.req_ids[: cad.num_reqs]:
                slot = proposer.state.slot_of(req_id)
                history[req_id] = proposer.history.tokens[slot].tolist()

    proposer._record_tokens = recording
    recorder = DraftRecorder(llm)
    recorder.enabled = True
    # One at a time first: the last prompt's prefix is then cached.
    outputs = (generate(llm, prompts[:-1], MAX_TOKENS)
               + generate(llm, prompts[-1:], MAX_TOKENS))
    run = dict(outputs=outputs, proposals=list(recorder.proposals.values()),
               per_pos=_accepted_per_pos(llm), stats=stats(proposer),
               history=history)
    shutdown(llm)
    return run


@pytest.mark.parametrize("draft_graph, pool, budget", [
    ("off", None, None), ("static", None, None),
    # The 700-token prompt's pooled pass (16 chunks at top_k 4), its step
    # drafting as a decode step through the routine.
    ("static", "auto", None),
    # Prompts in 128-token chunks: kept passes, cut steps.
    ("off", None, CHUNKED),
])
def test_lookup_is_lossless(tiny_target, prompts, plain_outputs, draft_graph, pool,
                            budget):
    engine = budget or {}
    run = _run(tiny_target, prompts, LOOKUP, draft_graph, pool, **engine)
    counts = run["stats"]

    assert run["outputs"] == plain_outputs
    assert counts["lookup_tokens"] > 0
    if draft_graph == "static":
        assert counts["graph_steps"] > 0, "the routine (and its lookup) ran"
    if pool is not None:
        assert counts["pooled_prompt_passes"] > 0
    if budget is not None:
        assert counts["deferred_prefill_passes"] > 0


def test_auto_looks_up_all_but_three_from_k_8(tiny_target, prompts, plain_outputs):
    # No lookup_tokens key: "auto" at K=8 with a draft model looks up 5.
    llm = make_llm(tiny_target, tiny_target, {**CMR, "draft_graph": "off"},
                   num_spec_tokens=8)
    proposer = drafter(llm)
    assert proposer.cfg.lookup_tokens == 5 and proposer.history is not None
    # What the real-pair benchmark records of the engine it ran: the defaults
    # pool (2 x top_k chunks) and grow the pool (8 a refresh), no window.
    assert resolved_keys(llm, {"additional_config": {}}) == {
        "draft_prompt_pool": 2 * CMR["top_k"], "draft_prefill_window": None,
        "lookup_tokens": 5, "draft_pool_fill": 8}
    outputs = generate(llm, prompts[:-1], MAX_TOKENS)
    counts, per_pos = stats(proposer), _accepted_per_pos(llm)
    # What the real-pair benchmark records around each cell.
    counters = plugin_counters(llm, {"additional_config": {}})
    shutdown(llm)
    assert counters["lookup_tokens"] == counts["lookup_tokens"]
    assert plugin_counters(None, {}) is None  # plain and vLLM's own modes
    assert outputs == plain_outputs[:-1]
    assert counts["lookup_tokens"] > 0 and counts["lookup_tokens"] % 5 == 0
    # The defaults' pool took each long prompt and grew at refreshes.
    assert counts["pooled_prompt_passes"] > 0 and counts["pool_fills"] > 0, counts
    assert len(per_pos) == 8 and sum(per_pos[3:]) > 0, per_pos


def test_the_routine_looks_up_as_the_eager_path(tiny_target, prompts, plain_outputs):
    eager = _run(tiny_target, prompts, LOOKUP, "off")
    static = _run(tiny_target, prompts, LOOKUP, "static")
    assert static["stats"]["graph_steps"] > 0
    assert static["proposals"] == eager["proposals"]
    assert static["outputs"] == eager["outputs"] == plain_outputs


def test_the_history_holds_each_requests_tokens(tiny_target, prompts, plain_outputs):
    run = _run(tiny_target, prompts, LOOKUP, "off")
    # generate() numbers requests in order; the last one's prefix was cached.
    assert len(run["history"]) == len(prompts)
    for req_id, prompt, output in zip(run["history"], prompts, run["outputs"],
                                      strict=True):
        tokens = prompt + output
        assert run["history"][req_id][: len(tokens)] == tokens, req_id


COPY_TEXT, COPY_REPEAT = 500, 100
"""A real model copies: a text, then its first 100 tokens again, which the
model goes on repeating (the tiny random model never repeats a 3-gram)."""


@pytest.fixture(scope="module")
def smollm2_copy(smollm2_model):
    """The copy prompt (a text, then its first tokens again) and plain
    decoding's 48 tokens after it."""
    from transformers import AutoTokenizer

    from benchmarks import prompts as prompt_data

    tokenizer = AutoTokenizer.from_pretrained(smollm2_model)
    (text,) = prompt_data.long_prompts(tokenizer, [COPY_TEXT])
    prompt = [text + text[:COPY_REPEAT]]
    plain = make_llm(smollm2_model, max_model_len=4096, **SMALL_BUDGET)
    want = generate(plain, prompt, max_tokens=48)
    shutdown(plain)
    return prompt, want


@pytest.mark.parametrize("draft_graph", ["off", "static"])
def test_looked_up_tokens_are_accepted(smollm2_model, smollm2_copy, draft_graph):
    """SmolLM2 drafting for itself with its full context (min_context past
    the prompt): its r drafts are accepted, and the tokens at the positions
    after them, which only the lookup proposes, are accepted too on a copy."""
    prompt, want = smollm2_copy
    llm = make_llm(smollm2_model, smollm2_model,
                   {"min_context": 4096, "lookup_tokens": LOOKUP,
                    "draft_graph": draft_graph},
                   num_spec_tokens=K, max_model_len=4096, **SMALL_BUDGET)
    got = generate(llm, prompt, max_tokens=48)
    per_pos = _accepted_per_pos(llm)
    counts = stats(drafter(llm))
    shutdown(llm)

    assert got == want
    assert counts["lookup_tokens"] > 0
    if draft_graph == "static":
        assert counts["graph_steps"] > 0
    # Most steps accept all r drafts; the lookup's positions accept as often.
    r = K - LOOKUP
    assert per_pos[r - 1] > 0 and sum(per_pos[r:]) >= per_pos[r - 1], per_pos


def test_carried_steps_are_lossless_and_replay_as_the_eager_path(smollm2_model,
                                                                 smollm2_copy):
    """carry_drafts 1 of r = 2 on SmolLM2's copy: steps after one whose
    lookup held draft one token and look up three. Output stays plain
    decoding's, some steps carry (not all: a step carries only after one
    whose lookup held), and the routine (a routine per draft count) proposes
    what the eager path proposes, step for step: on the CPU the host's copy
    of the signal lands at once, so both carry the same steps (on a GPU that
    depends on when it lands: ``test_draft_graph_gpu.py``)."""
    prompt, want = smollm2_copy
    runs = {}
    for draft_graph in ("off", "static"):
        llm = make_llm(smollm2_model, smollm2_model,
                       {"min_context": 4096, "lookup_tokens": LOOKUP,
                        "carry_drafts": 1, "draft_graph": draft_graph},
                       num_spec_tokens=K, max_model_len=4096, **SMALL_BUDGET)
        recorder = DraftRecorder(llm)
        recorder.enabled = True
        got = generate(llm, prompt, max_tokens=48)
        runs[draft_graph] = (got, stats(drafter(llm)),
                             list(recorder.proposals.values()))
        shutdown(llm)

    eager, static = runs["off"], runs["static"]
    steps = static[1]["graph_steps"] + static[1]["graph_fallbacks"]  # drafting
    assert static[1]["graph_steps"] > 0
    for got, counts, _ in runs.values():
        assert got == want
        assert 0 < counts["carried_steps"] < counts["decode_rows"], counts
        # LOOKUP looked up a step, one more (r - 1) where it carried.
        assert counts["lookup_tokens"] == LOOKUP * steps + counts["carried_steps"]
    assert static[1]["carried_steps"] == eager[1]["carried_steps"]
    assert static[2] == eager[2]


def test_self_draft_looks_up_losslessly(tiny_target, prompts, plain_outputs):
    """The target drafting for itself (K = 3 by default): one forward of its
    own through the view, two tokens looked up."""
    llm = make_llm(tiny_target, None, {**CMR, "self_draft": True, "lookup_tokens": 2})
    outputs = generate(llm, prompts, MAX_TOKENS)
    proposer = drafter(llm)
    counts = stats(proposer)
    shutdown(llm)

    assert type(proposer).__name__ == "SelfDraftProposer"
    assert outputs == plain_outputs
    assert counts["lookup_tokens"] > 0
