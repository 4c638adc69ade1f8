"""The captured draft routine's code drafts exactly what the eager path drafts.

On CPU nothing is captured, so ``draft_graph: "static"`` runs the routine a
CUDA graph records (``draft_graph.py``: static input buffers, the view
gathered at the graph's fixed width, vLLM's propose with the width's bound as
``max_seq_len``) on every step that a graph would replay. Its drafts must be
those of today's eager path: the same tokens accepted at every position, and
greedy output equal to plain decoding. The draft here is the target's own
checkpoint, so most drafts are accepted and a wrong draft token shows in the
counts. ``tests/kernels/test_draft_graph_gpu.py`` checks the captured graphs
the same way on a GPU.
"""

from __future__ import annotations

import pytest
from test_lossless import counter, drafter, generate, make_llm, shutdown

from benchmarks.harness.drafter import stats

pytestmark = pytest.mark.engine

LENGTHS = [1500, 90, 1000, 400]
MAX_TOKENS = 40
CMR = {"top_k": 4, "recent_tokens": 64, "min_context": 256}


def _run(target, prompts, draft_graph):
    llm = make_llm(target, target, {**CMR, "draft_graph": draft_graph})
    outputs = generate(llm, prompts, max_tokens=MAX_TOKENS)
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    per_pos = [m.values for m in llm.get_metrics()
               if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos"]
    counts = stats(drafter(llm))
    captured = drafter(llm).graphs is not None
    shutdown(llm)
    return outputs, accepted, per_pos, counts, captured


def test_static_routine_drafts_as_eager(tiny_target, prompts, plain_outputs):
    eager = _run(tiny_target, prompts, "off")
    static = _run(tiny_target, prompts, "static")
    outputs, accepted, per_pos, counts, captured = static

    assert captured, "static mode set up the routine on CPU"
    assert counts["graph_steps"] > 0, "decode steps ran the routine"
    assert counts["graph_fallbacks"] > 0, "prefill steps drafted eagerly"
    assert counts["view_rows"] > 0, "rows drafted through a view in the routine"
    assert eager[3]["graph_steps"] == 0
    assert outputs == plain_outputs == eager[0]
    assert accepted > 0
    assert per_pos == eager[2], "every position accepted the same drafts"
