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
import torch
from cpu_engine import counter, generate, make_llm, plain_reference, recorded_run, shutdown
from test_lossless import CMR

from benchmarks.harness.drafter import drafter, stats

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


def test_a_pooled_prompt_served_from_the_prefix_cache_stays_lossless(
        tiny_target, tiny_draft, prompts):
    """The same prompt twice, one after the other: the second finds the
    first's blocks cached (their draft KV pooled by the first) and pools
    again over them."""
    prompt = prompts[:1]
    plain = plain_reference(tiny_target, prompt, MAX_TOKENS)
    llm = make_llm(tiny_target, tiny_draft, {**CMR, "draft_prompt_pool": POOL},
                   **CHUNKED)
    first = generate(llm, prompt, max_tokens=MAX_TOKENS)
    again = generate(llm, prompt, max_tokens=MAX_TOKENS)
    hits = counter(llm, "vllm:prefix_cache_hits")
    pooled = stats(drafter(llm))["pooled_prompt_passes"]
    shutdown(llm)

    assert hits > 0
    assert pooled == 2
    assert first == again == plain


def _draft_kv_at_prompt_end(target, draft, prompt, spec_extend):
    """The draft's first layer's KV blocks of ``prompt`` right after the step
    that ends it, and (pooled) the pool's chunks and the window's start."""
    from vllm_specextend import compat

    llm = make_llm(target, draft, {**CMR, **spec_extend}, **CHUNKED)
    proposer = drafter(llm)
    layer = compat.attention_layer(proposer.vllm_config,
                                   sorted(proposer._draft_attn_layer_names)[0])
    propose, seen = proposer.propose, {}

    def recording(*args, **kwargs):
        drafts = propose(*args, **kwargs)
        cad = args[6] if len(args) > 6 else kwargs["common_attn_metadata"]
        seq = int(compat.batch_seq_lens_cpu(proposer.runner, 1)[0])
        if not seen and seq >= len(prompt):
            blocks = cad.block_table_tensor[0, : len(prompt) // proposer.block_size]
            seen["kv"] = compat.layer_kv_cache(layer)[blocks.long()].clone()
            slot = proposer.state.slot_of(compat.batch_req_ids(proposer.runner, 1)[0])
            if proposer.pools is not None:
                seen["pool"] = proposer.pools.chunks[slot].tolist()
                seen["window_start"] = int(proposer.state.window_start[slot])
        return drafts

    proposer.propose = recording
    generate(llm, [prompt], max_tokens=4)
    shutdown(llm)
    return seen


def test_the_pooled_pass_writes_the_draft_kv_where_its_views_read(
        tiny_target, tiny_draft, long_prompts):
    """A first layer's keys and values depend on a token and its position
    only: after the pooled pass the draft's first-layer KV of the sinks, the
    pool's chunks and the window's whole blocks is the full pass's, and the
    blocks of the other chunks were never written."""
    prompt = long_prompts([1500])[0]
    full = _draft_kv_at_prompt_end(tiny_target, tiny_draft, prompt, {})
    pooled = _draft_kv_at_prompt_end(tiny_target, tiny_draft, prompt,
                                     {"draft_prompt_pool": POOL})
    per_chunk = 1  # 32-token chunks of 32-token blocks (the CPU engines' block size)
    sinks = CMR.get("sink_tokens", 32) // 32
    window = range(pooled["window_start"] // 32, len(prompt) // 32)
    read = set(range(sinks)) | set(pooled["pool"]) | set(window)
    assert len(pooled["pool"]) == POOL and len(window) > 0
    for chunk in range(len(prompt) // 32):
        blocks = slice(chunk * per_chunk, (chunk + 1) * per_chunk)
        same = torch.allclose(pooled["kv"][blocks], full["kv"][blocks],
                              rtol=1e-4, atol=1e-5)
        assert same == (chunk in read), f"chunk {chunk}"
