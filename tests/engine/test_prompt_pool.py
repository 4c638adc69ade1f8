"""``draft_prompt_pool``: the draft's KV of a long prompt only for its sinks,
its pool of top-ranked chunks and its window (CPU, fp32, in-process engines).

Prompts are computed in chunks of 128 tokens per request and step, so every
prompt's earlier chunks come in steps of their own or beside other rows (the
steps ``kept_passes.py`` keeps or cuts): in pool mode those passes are
dropped and the step that ends each prompt runs its pooled pass. Greedy
output must stay plain decoding's; the draft must propose otherwise than
with its full pass (its KV of the prompt is computed from less); a pool as
large as every prompt's candidates must still be lossless.
"""

from __future__ import annotations

import pytest
from cpu_engine import make_llm, plain_reference, recorded_run
from test_lossless import CMR

pytestmark = pytest.mark.engine

LENGTHS = [1500, 1000, 700, 300]  # the last one too short to pool
MAX_TOKENS = 32
CHUNKED = dict(max_num_batched_tokens=1024, long_prefill_token_threshold=128)
POOL = 8


@pytest.fixture(scope="module")
def prompts(long_prompts):
    return long_prompts(LENGTHS)


def _run(target, draft, prompts, chunked=CHUNKED, **spec_extend):
    llm = make_llm(target, draft, {**CMR, **spec_extend}, **chunked)
    return recorded_run(llm, prompts, MAX_TOKENS)


@pytest.fixture(scope="module")
def full(tiny_target, tiny_draft, prompts):
    return _run(tiny_target, tiny_draft, prompts)


def test_pooled_prompts_stay_lossless_and_change_the_drafts(
        tiny_target, tiny_draft, prompts, plain_outputs, full):
    pooled = _run(tiny_target, tiny_draft, prompts, draft_prompt_pool=POOL)

    assert full["stats"]["pooled_prompt_passes"] == 0
    assert full["stats"]["dropped_prefill_passes"] == 0
    assert pooled["stats"]["pooled_prompt_passes"] == 3, "the three long prompts"
    assert pooled["stats"]["dropped_prefill_passes"] > 0
    assert pooled["outputs"] == full["outputs"] == plain_outputs
    assert pooled["proposals"] != full["proposals"]


def test_pooled_passes_too_many_for_one_forward_pass_alone(
        tiny_target, tiny_draft, long_prompts):
    """Three prompts of one length, 128 tokens a step each: they end together,
    and the step's first forward (512 tokens) cannot hold every pooled pass
    (~360 tokens each)."""
    same = long_prompts([1000, 1000, 1000])
    plain = plain_reference(tiny_target, same, MAX_TOKENS)
    pooled = _run(tiny_target, tiny_draft, same,
                  dict(max_num_batched_tokens=512, long_prefill_token_threshold=128),
                  draft_prompt_pool=POOL)

    assert pooled["stats"]["pooled_prompt_passes"] == 3
    assert pooled["stats"]["pooled_passes_alone"] >= 1
    assert pooled["outputs"] == plain
