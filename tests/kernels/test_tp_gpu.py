"""GPUs: the captured draft routine under tensor parallelism is lossless.

At TP=2 and TP=4 (vLLM's ``mp`` executor, CUDA graphs on, vLLM's defaults
but for the fusion of all-reduce and RMSNorm, which these hosts cannot run,
and fewer graph sizes: ``COMPILATION``), the plugin's greedy outputs must
equal vLLM's own speculation with the same draft and K: under CUDA graphs
vLLM's verification is the reference (``test_draft_graph_gpu.py``). Every
rank must have replayed the captured routine (its collectives inside the
graph) and counted the same steps, views and retrievals, with the draft
sharded as vLLM shards it or whole on every rank (``draft_placement``): a
rank that replayed while another drafted eagerly would hang the collectives
or draft from another view. fp16; head_dim 64 so that FlashAttention serves
the draft and the routine is captured.
"""

from __future__ import annotations

import gc
import os
import random

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA GPUs", allow_module_level=True)

os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
# This process has initialized CUDA (the skips above): TP workers must spawn.
os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"

K = 4
CMR = {"top_k": 8, "recent_tokens": 64, "min_context": 256}
COMPILATION = {"pass_config": {"fuse_allreduce_rms": False},
               # Three requests of K + 1 tokens: graphs up to 16 tokens, for
               # shorter engine starts (a TP=2 pair of engines with vLLM's 51
               # sizes ran past a call's 330 s on 2026-11-27).
               "cudagraph_capture_sizes": [1, 2, 4, 8, 16]}
"""vLLM 0.26 auto-selects FlashInfer's all-reduce + RMSNorm fusion at TP on
Hopper with its ``mnnvl`` backend, which needs NVLink multicast; these hosts
keep it off, and capture crashed (docs/results.md, "Tensor parallel")."""


def _generate(target, prompts, tp, spec_extend=None):
    from vllm import LLM, SamplingParams

    from benchmarks.harness.drafter import worker_state

    gc.collect()
    torch.cuda.empty_cache()
    llm = LLM(model=target, dtype="float16", block_size=16, max_model_len=4096,
              gpu_memory_utilization=0.3, seed=0, tensor_parallel_size=tp,
              max_num_seqs=4,
              distributed_executor_backend="mp", compilation_config=COMPILATION,
              speculative_config={"method": "draft_model", "model": target,
                                  "num_speculative_tokens": K},
              additional_config=({} if spec_extend is None
                                 else {"spec_extend": spec_extend}))
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    outputs = [list(o.outputs[0].token_ids) for o in
               llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
    ranks = worker_state(llm) if spec_extend is not None else None
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return outputs, ranks


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from benchmarks.models.builders import build_tiny_llama

    root = tmp_path_factory.mktemp("tiny_tp")
    # 8 heads, 4 KV heads: whole heads on each of 4 ranks; head_dim 64.
    return str(build_tiny_llama(root / "target", seed=0, hidden_size=512,
                                num_heads=8, num_kv_heads=4, dtype="float16"))


_REFERENCES: dict[int, list] = {}
"""vLLM's own speculation's outputs per TP size, shared by both placements."""


@pytest.mark.parametrize("placement", ["sharded", "replicated"])
@pytest.mark.parametrize("tp", [2, 4])
def test_captured_routine_under_tp_is_lossless(target, tp, placement):
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    rng = random.Random(tp)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (2000, 300, 3000)]
    if tp not in _REFERENCES:
        _REFERENCES[tp], _ = _generate(target, prompts, tp)
    outputs, ranks = _generate(target, prompts, tp,
                               {**CMR, "draft_placement": placement})

    assert outputs == _REFERENCES[tp]
    assert len(ranks) == tp
    # Timers differ per rank; every count must not.
    counts = [{k: v for k, v in r["stats"].items() if not k.endswith("_seconds")}
              for r in ranks]
    assert counts[0]["graph_steps"] > 0 and counts[0]["view_rows"] > 0
    assert counts[0]["retrievals"] > 0
    assert all(c == counts[0] for c in counts), "the ranks drafted otherwise"
