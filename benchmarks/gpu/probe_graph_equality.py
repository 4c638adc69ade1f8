"""GPU probe: which engines give plain decoding's greedy tokens under CUDA graphs.

tests/kernels/test_self_draft_gpu.py compares self_draft with plain decoding on a
tiny fp16 model. This probe puts vLLM's own draft_model speculation (no plugin)
and the plugin's modes side by side, eagerly, with vLLM's default graphs
(FULL_AND_PIECEWISE) and with PIECEWISE graphs only, so a mismatch can be told
apart: the plugin's (only its rows differ) or the numerics of vLLM's verification
kernels (vLLM's own speculation differs too).

    python3 -m benchmarks.gpu.probe_graph_equality --out OUT.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")

SPEC_EXTEND = {"top_k": 8, "recent_tokens": 64, "min_context": 256}


def generate(model_dir, prompts, graphs, spec):
    import torch
    from vllm import LLM, SamplingParams

    kwargs = dict(model=model_dir, dtype="float16", block_size=16,
                  max_model_len=4096, gpu_memory_utilization=0.25, seed=0,
                  enforce_eager=graphs == "eager")
    if graphs == "piecewise":
        kwargs["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
    if spec == "vllm_draft_model":
        kwargs["speculative_config"] = {"method": "draft_model", "model": model_dir,
                                        "num_speculative_tokens": 3}
    elif spec == "spec_extend":
        kwargs["speculative_config"] = {"method": "draft_model", "model": model_dir,
                                        "num_speculative_tokens": 3}
        kwargs["additional_config"] = {"spec_extend": SPEC_EXTEND}
    elif spec == "self_draft":
        kwargs["speculative_config"] = {"num_speculative_tokens": 3}
        self_draft = {**SPEC_EXTEND, "self_draft": True}
        kwargs["additional_config"] = {"spec_extend": self_draft}
    llm = LLM(**kwargs)
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return [list(o.outputs[0].token_ids) for o in outputs]


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--graphs", nargs="+",
                        default=["eager", "full", "piecewise"])
    parser.add_argument("--specs", nargs="+", default=[
        "plain", "vllm_draft_model", "spec_extend", "self_draft"])
    args = parser.parse_args()

    from benchmarks.models.builders import build_tiny_llama

    model_dir = str(build_tiny_llama(tempfile.mkdtemp() + "/tiny", seed=0,
                                     dtype="float16"))
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in (2000, 300, 1200)]
    rows = []
    reference = None
    for graphs in args.graphs:
        for spec in args.specs:
            try:
                tokens = generate(model_dir, prompts, graphs, spec)
            except Exception as exc:  # record and go on: the probe compares rows
                rows.append({"graphs": graphs, "spec": spec, "error": repr(exc)[:500]})
                print(rows[-1], flush=True)  # noqa: T201
                continue
            reference = reference or tokens  # the first row (plain, eager)
            pairs = zip(tokens, reference, strict=True)
            row = {"graphs": graphs, "spec": spec, "tokens": tokens,
                   "first_difference_from_first_row": [
                       first_difference(t, r) for t, r in pairs]}
            rows.append(row)
            print(graphs, spec, row["first_difference_from_first_row"],  # noqa: T201
                  flush=True)
            with open(args.out, "w") as f:
                json.dump({"rows": rows}, f)


if __name__ == "__main__":
    main()
