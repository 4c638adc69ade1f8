"""A draft with more query heads than its target drafts every position as
it would alone (CPU engines, in process).

vLLM 0.26's CPU attention builders count the target's query heads for the
draft's layers too, and schedule a one-token query's attention by that
count: the real Qwen2.5-Coder pair (a 14-head draft, a 12-head target) had
every draft after a step's first rejected on this CPU. The plugin's CPU
worker gives those builders the draft layers' own heads
(``compat.CPU_DRAFT_ATTENTION_HEADS``). The draft here is ``tiny_target``
with twice its query heads and the same function
(``builders.build_wide_heads_twin``), over prompts the draft reads whole
(``min_context`` above them), so each of its drafts is the target's own
greedy token: all of them are accepted, at every position.
"""

from __future__ import annotations

import pytest
from cpu_engine import generate, make_llm, shutdown

from benchmarks.harness.drafter import drafter

pytestmark = pytest.mark.engine

LENGTHS = [200, 300]
MAX_TOKENS = 32
K = 4


def _per_position(llm) -> tuple[int, list[int]]:
    metrics = {m.name: m for m in llm.get_metrics()}
    return (int(metrics["vllm:spec_decode_num_drafts"].value),
            list(metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values))


def test_a_draft_with_more_heads_drafts_every_position(
        tiny_target, tiny_wide_draft, prompts, plain_outputs):
    llm = make_llm(tiny_target, tiny_wide_draft, {"min_context": 1024},
                   num_spec_tokens=K)
    builders = [b for g in drafter(llm).draft_attn_groups for b in g.metadata_builders]
    outputs = generate(llm, prompts, MAX_TOKENS)
    drafts, per_position = _per_position(llm)
    shutdown(llm)
    assert outputs == plain_outputs
    assert builders and all(b.num_heads == 8 for b in builders)
    # Every draft accepted at every position (a tie broken otherwise in fp32
    # may cost one).
    assert drafts > 0 and len(per_position) == K
    assert all(n >= drafts - 1 for n in per_position), (drafts, per_position)
