"""GPU: the captured draft routine drafts what vLLM's piecewise path drafts.

The same engine settings run twice with CUDA graphs on (vLLM's defaults, so
the plugin's async scheduling too): the draft routine captured per batch size
(``draft_graph: "auto"``) and vLLM's own piecewise draft loop (``"off"``).
The draft is the target's own checkpoint, so most drafts are accepted and any
draft token the graph gets wrong shows in the per-position acceptance counts,
which must be equal, as must the greedy outputs. Both must equal vLLM's own
speculation with the same draft and K (no plugin): under CUDA graphs vLLM's
verification is the reference, not plain decoding (see
``test_self_draft_gpu.py``). fp16, V1 runner, one process.
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
CMR = {"top_k": 8, "recent_tokens": 64, "min_context": 256}


def _generate(model_dir, prompts, spec_extend=None):
    from vllm import LLM, SamplingParams

    from benchmarks.harness.drafter import drafter, stats

    llm = LLM(model=model_dir, dtype="float16", block_size=16, max_model_len=4096,
              gpu_memory_utilization=0.3, seed=0, disable_log_stats=False,
              speculative_config={"method": "draft_model", "model": model_dir,
                                  "num_speculative_tokens": K},
              additional_config=({} if spec_extend is None
                                 else {"spec_extend": spec_extend}))
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    outputs = [list(o.outputs[0].token_ids) for o in
               llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    per_pos = [m.values for m in llm.get_metrics()
               if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos"]
    info = {"async": llm.llm_engine.vllm_config.scheduler_config.async_scheduling}
    if spec_extend is not None:
        info.update(stats(drafter(llm)), captured=drafter(llm).graphs is not None)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return outputs, per_pos, info


@pytest.fixture(scope="module")
def model_and_prompts(tmp_path_factory):
    from benchmarks.models.builders import build_tiny_llama

    # head_dim 64: FlashAttention serves it, so the routine can be captured.
    model_dir = str(build_tiny_llama(tmp_path_factory.mktemp("tiny") / "m", seed=0,
                                     hidden_size=256, num_heads=4, num_kv_heads=2,
                                     dtype="float16"))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(n)]
               for n in (2000, 300, 1200, 3000, 700)]
    return model_dir, prompts


@pytest.mark.parametrize("batch", [1, 5])
def test_captured_routine_drafts_as_piecewise(model_and_prompts, batch):
    model_dir, prompts = model_and_prompts
    prompts = prompts[:batch]
    reference, ref_pos, _ = _generate(model_dir, prompts)
    eager, eager_pos, eager_info = _generate(model_dir, prompts,
                                             {**CMR, "draft_graph": "off"})
    graph, graph_pos, info = _generate(model_dir, prompts, {**CMR})

    assert info["captured"] and info["async"] and eager_info["async"]
    assert info["graph_steps"] > 0 and eager_info["graph_steps"] == 0
    assert info["view_rows"] > 0
    assert graph_pos == eager_pos, "the graph accepted other drafts"
    assert graph == eager == reference
    assert sum(sum(v) for v in graph_pos) > 0
