"""GPU: the target drafting for itself under vLLM's compiled, graph-captured model.

The drafter calls the target's own module between its verifications, with
PIECEWISE graphs (attention eager, reading the view) while the target's
verification may replay FULL graphs. Eagerly, greedy output must equal plain
decoding. Compiled with CUDA graphs, it must equal vLLM's own speculative
decoding with the same K (``draft_model`` with the target as its draft, no
plugin): on H100 that leaves plain decoding itself at token 45 of the 300-token
prompt, in fp16, the compiled 4-token verification rounding differently from
1-token decoding (benchmarks/results/gpu_tests/
20261123T1815Z_h100_graph-equality-probe.json). Everything runs on vLLM's V1
runner (``VLLM_USE_V2_MODEL_RUNNER=0``), as ``--spec-extend`` does.
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


def _generate(model_dir, prompts, eager, speculative_config=None, spec_extend=None):
    from vllm import LLM, SamplingParams

    kwargs = dict(model=model_dir, dtype="float16", enforce_eager=eager,
                  block_size=16, max_model_len=4096, gpu_memory_utilization=0.25,
                  seed=0, disable_log_stats=False)
    if speculative_config is not None:
        kwargs["speculative_config"] = speculative_config
    if spec_extend is not None:
        kwargs["additional_config"] = {"spec_extend": spec_extend}
    llm = LLM(**kwargs)
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return [list(o.outputs[0].token_ids) for o in outputs], metrics


@pytest.mark.parametrize("eager", [True, False])
def test_self_draft_is_lossless_on_gpu(tmp_path, eager):
    from benchmarks.models.builders import build_tiny_llama

    model_dir = str(build_tiny_llama(tmp_path / "tiny", seed=0, dtype="float16"))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (2000, 300, 1200)]
    if eager:
        reference, _ = _generate(model_dir, prompts, eager)
    else:
        reference, _ = _generate(
            model_dir, prompts, eager,
            {"method": "draft_model", "model": model_dir, "num_speculative_tokens": 3},
        )
    spec, metrics = _generate(
        model_dir, prompts, eager, {"num_speculative_tokens": 3},
        {"self_draft": True, "top_k": 8, "recent_tokens": 64, "min_context": 256},
    )
    assert spec == reference
    assert metrics.get("vllm:spec_decode_num_drafts", 0) > 0
