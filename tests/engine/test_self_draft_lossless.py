"""The target drafting for itself (``self_draft``) keeps greedy output exact.

Offline CPU engines in this process, as in ``test_lossless``: a mixed-length
batch where the view applies to some rows only, with prefix caching on and off,
under forced preemption, with the streaming policy, with aborts, and at tensor
parallel size 2. The draft writes its tokens' KV into the target's own cache;
these tests fail if any of it survives into a verification.
"""

from __future__ import annotations

import os

import pytest
from cpu_engine import counter, generate, make_llm, plain_reference, shutdown
from test_lossless import CMR, SMALL_BUDGET

from benchmarks.harness import drafter as harness
from benchmarks.harness.drafter import drafter
from vllm_specextend import compat

pytestmark = pytest.mark.engine

SELF = {**CMR, "self_draft": True}
K = 3


@pytest.fixture(scope="module")
def prompts(long_prompts):
    batch = long_prompts([1500, 90, 1000, 400, 700])
    # A prompt sharing a long prefix with the first one: a prefix-cache hit.
    batch.append(batch[0][:1200] + long_prompts([200], start=7)[0])
    return batch


@pytest.fixture(scope="module")
def plain_outputs(tiny_target, prompts):
    return plain_reference(tiny_target, prompts)


def num_blocks(llm) -> int:
    return llm.llm_engine.engine_core.engine_core.vllm_config.cache_config.num_gpu_blocks


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_self_draft_matches_plain(tiny_target, prompts, plain_outputs, prefix_caching):
    llm = make_llm(tiny_target, None, SELF, num_spec_tokens=K,
                   enable_prefix_caching=prefix_caching)
    proposer = drafter(llm)
    outputs = generate(llm, prompts)
    stats = harness.stats(proposer)
    drafts = counter(llm, "vllm:spec_decode_num_drafts")
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    generate(llm, [prompts[1][:16]], max_tokens=2)  # delivers the finished ids
    held = len(harness.selection_store(proposer))
    shutdown(llm)

    assert type(proposer).__name__ == "SelfDraftProposer"
    assert proposer.model is not None and not any(
        "draft_model" in name for name in proposer._draft_attn_layer_names
    ), "no draft layers: the drafter runs the target's"
    # The target's CUDA graphs read their inputs where the target writes them:
    # the drafter must write its own there too (docs/design.md).
    runner_ids, runner_positions = compat.model_input_buffers(proposer.runner)
    assert proposer.input_ids.data_ptr() == runner_ids.data_ptr()
    assert proposer.positions.data_ptr() == runner_positions.data_ptr()
    assert outputs == plain_outputs
    assert drafts > 0 and accepted > 0
    assert stats["retrievals"] > 0
    assert 0 < stats["view_rows"] < stats["decode_rows"], "views on some rows only"
    assert stats["draft_context_tokens"] < stats["full_context_tokens"]
    assert held == 0, "finished requests leave no selection state"


def test_self_draft_adds_no_kv_memory(tiny_target, tiny_draft):
    """Same KV budget: self_draft holds as many tokens as plain decoding,
    draft_model fewer (its draft mirrors every token)."""
    blocks = {}
    for mode, draft, spec_extend in (
        ("plain", None, None),
        ("self_draft", None, SELF),
        ("draft_model", tiny_draft, None),
    ):
        llm = make_llm(tiny_target, draft, spec_extend, num_spec_tokens=K,
                       kv_cache_memory_bytes=64 << 20)
        blocks[mode] = num_blocks(llm)
        shutdown(llm)
    assert blocks["self_draft"] == blocks["plain"] > blocks["draft_model"]


def test_self_draft_under_preemption(tiny_target, prompts, plain_outputs):
    # 70 blocks of 32 tokens (no draft KV here): the batch outgrows them and
    # the scheduler preempts (measured: 1 preemption; 86 blocks give none).
    llm = make_llm(tiny_target, None, SELF, num_spec_tokens=K,
                   kv_cache_memory_bytes=int(2.2 * 2**20))
    outputs = generate(llm, prompts)
    preemptions = counter(llm, "vllm:num_preemptions")
    stats = harness.stats(drafter(llm))
    shutdown(llm)

    assert preemptions > 0
    assert outputs == plain_outputs
    assert stats["view_rows"] > 0


def test_self_draft_streaming(tiny_target, prompts, plain_outputs):
    llm = make_llm(tiny_target, None, {**SELF, "policy": "streaming"},
                   num_spec_tokens=K)
    outputs = generate(llm, prompts)
    stats = harness.stats(drafter(llm))
    shutdown(llm)

    assert outputs == plain_outputs
    assert stats["retrievals"] == 0 and stats["view_rows"] > 0


def test_self_draft_abort_frees_state(tiny_target, prompts, plain_outputs):
    from vllm import SamplingParams

    llm = make_llm(tiny_target, None, SELF, num_spec_tokens=K)
    engine = llm.llm_engine
    proposer = drafter(llm)
    params = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    for i, prompt in enumerate(prompts[:3]):
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)

    def held(prefix):  # the engine suffixes request ids internally
        return [r for r in harness.selection_store(proposer) if r.startswith(prefix)]

    for _ in range(30):
        engine.step()
        if any(r.startswith("r0") for r in harness.selections(proposer)):
            break
    assert held("r0"), "a long request holds state while decoding"
    engine.abort_request(["r0"])
    engine.step()
    assert not held("r0")
    while engine.has_unfinished_requests():
        engine.step()
    # The engine keeps decoding exactly after the abort.
    outputs = generate(llm, prompts[1:3])
    assert not held("r1") and not held("r2")
    shutdown(llm)
    assert outputs == plain_outputs[1:3]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core per TP rank")
def test_self_draft_tensor_parallel(tiny_target, prompts, plain_outputs, monkeypatch):
    # Each rank drafts with its own shard of the target's heads and KV.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    llm = make_llm(tiny_target, None, SELF, num_spec_tokens=K,
                   tensor_parallel_size=2, distributed_executor_backend="mp")
    outputs = generate(llm, prompts)
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    shutdown(llm)

    assert outputs == plain_outputs
    assert accepted > 0


def test_self_draft_off_by_batch_size(tiny_target, prompts, plain_outputs):
    """vLLM's per-batch-size schedule as the switch to plain decoding: K = 0
    at batch 2 and up runs no draft forward, K = 3 at batch 1 drafts."""
    llm = make_llm(
        tiny_target, None, SELF, num_spec_tokens=K,
        speculative_config={
            "num_speculative_tokens_per_batch_size": [[1, 1, K], [2, 256, 0]]
        },
    )
    proposer = drafter(llm)
    batch = generate(llm, prompts[2:5])
    drafts_batched = counter(llm, "vllm:spec_decode_num_drafts")
    views_batched = harness.stats(proposer)["view_rows"]
    single = generate(llm, prompts[:1])
    drafts_single = counter(llm, "vllm:spec_decode_num_drafts") - drafts_batched
    shutdown(llm)

    assert batch == plain_outputs[2:5] and single == plain_outputs[:1]
    assert drafts_batched == 0 and views_batched == 0
    assert drafts_single > 0


def test_self_draft_real_weights_keep_drafts(smollm2_model):
    """SmolLM2 drafting for itself through a view of under half its context:
    a trained model attends to few chunks, so a consistent view keeps most of
    its own drafts. A view that read wrong blocks, positions or lengths (or
    stale draft KV) would drop acceptance towards that of an unrelated draft."""
    from transformers import AutoTokenizer

    from benchmarks import prompts as prompt_data

    tokenizer = AutoTokenizer.from_pretrained(smollm2_model)
    prompt = prompt_data.long_prompts(tokenizer, [1800])
    plain = make_llm(smollm2_model, max_model_len=4096, **SMALL_BUDGET)
    reference = generate(plain, prompt, max_tokens=40)
    shutdown(plain)
    llm = make_llm(
        smollm2_model, None,
        {"self_draft": True, "top_k": 16, "recent_tokens": 128, "min_context": 512},
        num_spec_tokens=4, max_model_len=4096, **SMALL_BUDGET,
    )
    outputs = generate(llm, prompt, max_tokens=40)
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    proposed = counter(llm, "vllm:spec_decode_num_draft_tokens")
    stats = harness.stats(drafter(llm))
    shutdown(llm)

    assert outputs == reference
    assert stats["view_rows"] > 0
    assert stats["draft_context_tokens"] < 0.5 * stats["full_context_tokens"]
    assert proposed > 0 and accepted >= 0.75 * proposed, (accepted, proposed)


def test_self_draft_cuts_the_targets_vocabulary(tiny_target, prompts, plain_outputs):
    """``draft_vocab`` under self_draft: the target's own lm_head rows, cut;
    output stays exact and no draft passes the cut."""
    from benchmarks.harness.drafter import DraftRecorder

    cut = 256
    llm = make_llm(tiny_target, None, {**SELF, "draft_vocab": cut}, num_spec_tokens=K)
    recorder = DraftRecorder(llm)
    recorder.enabled = True
    outputs = generate(llm, prompts)
    tokens = [t for steps in recorder.proposals.values() for step in steps for t in step]
    shutdown(llm)

    assert outputs == plain_outputs
    assert tokens and max(tokens) < cut
    assert any(t >= cut for out in plain_outputs for t in out), "the cut matters here"


def test_draft_vocab_past_the_vocabulary_is_one_clean_error(tiny_target):
    from vllm_specextend.config import SpecExtendConfigError

    with pytest.raises(SpecExtendConfigError, match=r"draft_vocab=100000 exceeds the drafter's "
                       r"vocabulary \(512 tokens\); use at most 512"):
        make_llm(tiny_target, None, {**SELF, "draft_vocab": 100000}, num_spec_tokens=K)
