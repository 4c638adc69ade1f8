"""GPU: the captured draft routine drafts what vLLM's piecewise path drafts.

The same engine settings run twice with CUDA graphs on (vLLM's defaults, so
the plugin's async scheduling too): the draft routine captured per batch size
(``draft_graph: "auto"``) and vLLM's own piecewise draft loop (``"off"``).
Every step's proposals must be equal, token for token, as must the greedy
outputs; and both outputs must equal vLLM's own speculation with the same
draft and K (no plugin): under CUDA graphs vLLM's verification is the
reference, not plain decoding (see ``test_self_draft_gpu.py``). For a draft
model (the target's own checkpoint, so most drafts are accepted) and an
EAGLE-3 head. fp16, V1 runner, one process; head_dim 64 so that
FlashAttention serves the draft and the routine can be captured.
"""

from __future__ import annotations

import gc
import os
import random

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"

K = 4
CMR = {"top_k": 8, "recent_tokens": 64, "min_context": 256,
       "draft_prompt_pool": "auto"}  # the pooled passes captured too


def _generate(target, method, draft, prompts, spec_extend=None, **engine):
    from vllm import LLM, SamplingParams

    from benchmarks.harness.drafter import (
        DraftRecorder,
        drafter,
        graphs_captured,
        stats,
    )

    # vLLM's start-up asserts that free memory did not grow while it profiled:
    # hand back what earlier tests of this process left cached first.
    gc.collect()
    torch.cuda.empty_cache()
    llm = LLM(model=target, dtype="float16", block_size=16, max_model_len=4096,
              gpu_memory_utilization=0.3, seed=0, disable_log_stats=False,
              speculative_config={"method": method, "model": draft,
                                  "num_speculative_tokens": K},
              additional_config=({} if spec_extend is None
                                 else {"spec_extend": spec_extend}), **engine)
    recorder = DraftRecorder(llm)
    recorder.enabled = True
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    outputs = [list(o.outputs[0].token_ids) for o in
               llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    run = {"outputs": outputs, "proposals": list(recorder.proposals.values()),
           "async": llm.llm_engine.vllm_config.scheduler_config.async_scheduling}
    if spec_extend is not None:
        run.update(stats=stats(drafter(llm)), captured=graphs_captured(drafter(llm)))
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return run


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from benchmarks.models.builders import build_tiny_eagle3, build_tiny_llama

    root = tmp_path_factory.mktemp("tiny")
    target = build_tiny_llama(root / "target", seed=0, hidden_size=256, num_heads=4,
                              num_kv_heads=2, dtype="float16")
    head = build_tiny_eagle3(root / "eagle3", target, max_position_embeddings=4096)
    return {"draft_model": str(target), "eagle3": str(head), "target": str(target)}


@pytest.mark.parametrize("method, batch", [("draft_model", 1), ("draft_model", 5),
                                           ("eagle3", 5)])
def test_captured_routine_drafts_as_piecewise(models, method, batch):
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(n)]
               for n in (2000, 300, 1200, 3000, 700)][:batch]
    target, draft = models["target"], models[method]
    reference = _generate(target, method, draft, prompts)
    eager = _generate(target, method, draft, prompts, {**CMR, "draft_graph": "off"})
    graph = _generate(target, method, draft, prompts, dict(CMR))

    assert graph["captured"] and graph["async"] and eager["async"]
    assert graph["stats"]["graph_steps"] > 0 and eager["stats"]["graph_steps"] == 0
    assert graph["stats"]["view_rows"] > 0
    # draft_prompt_pool "auto" (CMR's): AUTO_POOL_PER_TOP_K x 8 chunks for a
    # draft model (16: prompts from 672 tokens), the full pass for the
    # EAGLE-3 head.
    from vllm_specextend.config import AUTO_POOL_PER_TOP_K, SpecExtendConfig

    pool = SpecExtendConfig(**{**CMR, "draft_prompt_pool": AUTO_POOL_PER_TOP_K * 8})
    pooled = (sum(n >= pool.pool_min_prompt for n in map(len, prompts))
              if method == "draft_model" else 0)
    assert graph["stats"]["pooled_prompt_passes"] == pooled
    assert graph["proposals"] == eager["proposals"], "the graph drafted otherwise"
    assert graph["outputs"] == eager["outputs"] == reference["outputs"]


def test_a_growing_pool_drafts_as_piecewise(models):
    """``draft_pool_fill`` under CUDA graphs and async scheduling: steps whose
    pools grow run the fill's forwards (the draft's piecewise graphs up to
    their size, through a compact block table), then the captured routine,
    which drafts what the piecewise path drafts; the outputs stay vLLM's own
    speculation's."""
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (3000, 2000, 1200)]
    target = models["target"]
    spec = {**CMR, "draft_pool_fill": 4}
    reference = _generate(target, "draft_model", target, prompts)
    eager = _generate(target, "draft_model", target, prompts, {**spec, "draft_graph": "off"})
    graph = _generate(target, "draft_model", target, prompts, spec)

    assert graph["captured"] and graph["stats"]["graph_steps"] > 0
    assert graph["stats"]["pool_fills"] > 0
    assert graph["stats"]["pool_fills"] == eager["stats"]["pool_fills"]
    assert graph["proposals"] == eager["proposals"], "the graph drafted otherwise"
    assert graph["outputs"] == eager["outputs"] == reference["outputs"]


def test_captured_routine_keeps_the_draft_vocab_cut(models):
    """``draft_vocab`` in the captured routine: the graph drafts what the
    piecewise path drafts with the same cut, never an id past it, and the
    target's verification keeps the output vLLM's own speculation's."""
    cut = 256
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (2000, 300, 1200)]
    target = models["target"]
    reference = _generate(target, "draft_model", target, prompts)
    spec = {**CMR, "draft_vocab": cut}
    eager = _generate(target, "draft_model", target, prompts, {**spec, "draft_graph": "off"})
    graph = _generate(target, "draft_model", target, prompts, spec)
    tokens = [t for steps in graph["proposals"] for step in steps for t in step]

    assert graph["captured"] and graph["stats"]["graph_steps"] > 0
    assert tokens and max(tokens) < cut
    assert graph["proposals"] == eager["proposals"], "the graph drafted otherwise"
    assert graph["outputs"] == eager["outputs"] == reference["outputs"]
    # The cut mattered: the target writes ids past it.
    assert any(t >= cut for out in reference["outputs"] for t in out)


def test_captured_routine_looks_up_as_piecewise(models):
    """``lookup_tokens``: the graphs are captured for K - m forwards and the
    lookup; they propose what the piecewise path with the same lookup
    proposes, step by step, and output stays vLLM's own speculation's. The
    prompts repeat their first half, so keys recur in the context."""
    rng = random.Random(2)
    halves = [[rng.randrange(3, 500) for _ in range(n)] for n in (1000, 150, 600)]
    prompts = [h + h for h in halves]
    target = models["target"]
    reference = _generate(target, "draft_model", target, prompts)
    spec = {**CMR, "lookup_tokens": 2}
    eager = _generate(target, "draft_model", target, prompts,
                      {**spec, "draft_graph": "off"})
    graph = _generate(target, "draft_model", target, prompts, spec)

    assert graph["captured"] and graph["stats"]["graph_steps"] > 0
    assert graph["stats"]["lookup_tokens"] > 0
    assert graph["proposals"] == eager["proposals"], "the graph looked up otherwise"
    assert graph["outputs"] == eager["outputs"] == reference["outputs"]


def test_captured_routine_carries_losslessly(models, monkeypatch):
    """``carry_drafts``: a graph per draft count (2 and 1 of K=4, 2 looked
    up). The tiny random target rarely has a lookup hold, so the host's
    answer alternates here (in process: ``VLLM_ENABLE_V1_MULTIPROCESSING``
    0) and both graphs replay; the signal's own updates and copies still run.
    The output must stay vLLM's own speculation's."""
    from vllm_specextend.drafting.carry import CarrySignal

    answers = iter(int(i % 2) for i in range(10**6))
    monkeypatch.setattr(CarrySignal, "carries", lambda self, slots: bool(next(answers)))
    rng = random.Random(2)
    halves = [[rng.randrange(3, 500) for _ in range(n)] for n in (1000, 150, 600)]
    prompts = [h + h for h in halves]
    target = models["target"]
    reference = _generate(target, "draft_model", target, prompts)
    graph = _generate(target, "draft_model", target, prompts,
                      {**CMR, "lookup_tokens": 2, "carry_drafts": 1})

    assert graph["captured"] and graph["stats"]["graph_steps"] > 0
    assert 0 < graph["stats"]["carried_steps"] < graph["stats"]["graph_steps"]
    assert graph["outputs"] == reference["outputs"]
