"""The captured draft routine's code drafts exactly what the eager path drafts.

On CPU nothing is captured, so ``draft_graph: "static"`` runs the routine a
CUDA graph records (``draft_graph.py``: static input buffers, the view
gathered at the graph's fixed width, vLLM's propose with the width's bound as
``max_seq_len``) on every step that a graph would replay. Its proposals must
be those of today's eager path, token for token, and greedy output must equal
plain decoding: for a draft model (here the target's own checkpoint, so most
drafts are accepted) and for an EAGLE-3 head (its inputs are the target's
hidden states). ``tests/kernels/test_draft_graph_gpu.py`` checks the captured
graphs on a GPU.
"""

from __future__ import annotations

import pytest
from cpu_engine import counter, generate, make_llm, shutdown

from benchmarks.harness.drafter import DraftRecorder, drafter, graphs_captured, stats

pytestmark = pytest.mark.engine

LENGTHS = [1500, 90, 1000, 400]
MAX_TOKENS = 40
CMR = {"top_k": 4, "recent_tokens": 64, "min_context": 256}


def _run(target, prompts, draft_graph, method, draft, **spec_extend):
    llm = make_llm(target, spec_extend={**CMR, "draft_graph": draft_graph, **spec_extend},
                   speculative_config={"method": method, "model": draft,
                                       "num_speculative_tokens": 3})
    recorder = DraftRecorder(llm)
    recorder.enabled = True
    outputs = generate(llm, prompts, max_tokens=MAX_TOKENS)
    run = dict(outputs=outputs, proposals=list(recorder.proposals.values()),
               accepted=counter(llm, "vllm:spec_decode_num_accepted_tokens"),
               drafted=counter(llm, "vllm:spec_decode_num_draft_tokens"),
               stats=stats(drafter(llm)), captured=graphs_captured(drafter(llm)))
    shutdown(llm)
    return run


@pytest.mark.parametrize("method, draft, pool", [
    ("draft_model", "tiny_target", None),
    ("draft_model", "tiny_target", "auto"),  # the default: 16 chunks at top_k 4
    ("eagle3", "tiny_eagle3", "auto"),  # "auto" steps aside for a head: full pass
])
def test_static_routine_drafts_as_eager(request, tiny_target, prompts, plain_outputs,
                                        method, draft, pool):
    draft = request.getfixturevalue(draft)
    eager = _run(tiny_target, prompts, "off", method, draft, draft_prompt_pool=pool)
    static = _run(tiny_target, prompts, "static", method, draft, draft_prompt_pool=pool)
    counts = static["stats"]

    assert static["captured"], "static mode set up the routine on CPU"
    assert counts["graph_steps"] > 0, "decode steps ran the routine"
    # Pooled, each long prompt's pass (one chunk here) is replaced by its
    # pooled pass: the 1,500- and 1,000-token prompts.
    pooled = method == "draft_model" and pool == "auto"
    assert counts["pooled_prompt_passes"] == (2 if pooled else 0)
    if not pooled:
        assert counts["graph_fallbacks"] > 0, "prefill steps drafted eagerly"
    assert counts["view_rows"] > 0, "rows drafted through a view in the routine"
    assert not eager["captured"] and eager["stats"]["graph_steps"] == 0
    assert static["proposals"] == eager["proposals"], "the same drafts, step by step"
    assert static["outputs"] == eager["outputs"] == plain_outputs
    if method == "draft_model":
        assert static["accepted"] > 0


@pytest.mark.parametrize("draft_graph", ["off", "static"])
def test_draft_vocab_drafts_only_its_first_ids(tiny_target, prompts, plain_outputs,
                                               draft_graph):
    """``draft_vocab``: greedy drafts come from the first N token ids, eagerly
    and in the captured routine's code; the target drafting for itself would
    otherwise propose its own tokens, so the ones past the cut are rejected
    and output stays plain decoding's."""
    cut = 256
    run = _run(tiny_target, prompts, draft_graph, "draft_model", tiny_target,
               draft_vocab=cut)
    tokens = [t for steps in run["proposals"] for step in steps for t in step]

    assert run["outputs"] == plain_outputs
    assert tokens and max(tokens) < cut
    # The cut matters here: the target writes ids past it...
    assert any(t >= cut for out in plain_outputs for t in out)
    # ...which its own drafts can no longer propose.
    assert 0 < run["accepted"] < run["drafted"]
    if draft_graph == "static":
        assert run["stats"]["graph_steps"] > 0
