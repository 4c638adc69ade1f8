"""EAGLE-1 and EAGLE-3 with ``--spec-extend`` (CPU, fp32): the head's KV goes
through the same view, and through compacted positions when the head has fewer
positions than the context. Random heads are rarely accepted; these tests check
that the head drafts through views and that greedy output stays exact.
"""

from __future__ import annotations

import pytest
from test_compaction import FITS, assert_scratch_within_budget, scratch_footprint

pytestmark = pytest.mark.engine

K = 3
LENGTHS = [1900, 90, 1500]
MAX_TOKENS = 32
CMR = {"top_k": 4, "recent_tokens": 64, "min_context": 256}


def run_eagle(target, head, spec_extend, prompts, method="eagle3"):
    from cpu_engine import counter, generate, make_llm, shutdown

    from benchmarks.harness.drafter import compactor, drafter, stats

    llm = make_llm(
        target,
        spec_extend=spec_extend,
        speculative_config={
            "method": method,
            "model": head,
            "num_speculative_tokens": K,
        },
    )
    proposer = drafter(llm)
    outputs = generate(llm, prompts, max_tokens=MAX_TOKENS)
    result = dict(
        outputs=outputs,
        drafts=counter(llm, "vllm:spec_decode_num_drafts"),
        stats=stats(proposer),
        cls=type(proposer).__name__,
        head=type(proposer.model).__name__,
        compact=compactor(proposer) is not None,
    )
    if compactor(proposer) is not None:
        result.update(scratch_footprint(llm, proposer))
    shutdown(llm)
    return result


@pytest.mark.parametrize(
    "method, head, model_cls",
    [
        # EAGLE-1: one head layer over the token embedding and the target's
        # last hidden state.
        ("eagle", "tiny_eagle", "EagleLlamaForCausalLM"),
        ("eagle3", "tiny_eagle3", "Eagle3LlamaForCausalLM"),
    ],
)
def test_eagle_view_is_lossless(request, tiny_target, prompts, plain_outputs,
                                method, head, model_cls):
    run = run_eagle(tiny_target, request.getfixturevalue(head), CMR, prompts, method)
    stats = run["stats"]

    assert run["cls"] == "SpecExtendEagleProposer" and run["head"] == model_cls
    assert not run["compact"]
    assert run["outputs"] == plain_outputs
    assert run["drafts"] > 0 and stats["retrievals"] > 0
    assert 0 < stats["view_rows"] < stats["decode_rows"], "CMR on some rows only"


def test_short_eagle3_head_compacts(tiny_target, tiny_short_eagle3, prompts,
                                    plain_outputs):
    run = run_eagle(tiny_target, tiny_short_eagle3, FITS, prompts)
    stats = run["stats"]

    assert run["compact"], "auto: the head has 256 positions, the target 2048"
    assert run["outputs"] == plain_outputs
    assert run["drafts"] > 0 and stats["compactions"] > 0
    # Rows past the head's positions always draft through a view; the short
    # prompt's row (90 + 32 tokens) fits and keeps its full KV.
    assert 0 < stats["view_rows"] < stats["decode_rows"]
    assert_scratch_within_budget(run)
