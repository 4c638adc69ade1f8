"""The draft sees exactly sinks + selected chunks + window, at original positions.

A one-layer tiny model drafts for itself (K=1). With one layer, a cached key or
value depends only on its token and position, so for every draft step that used
a view, the proposed token must equal what the same model (transformers, fp32)
predicts from only the kept tokens at their original position ids. (With more
layers, cached K/V also carry the context they were computed with, so no such
reference exists.) A wrong block, offset or causal boundary changes this
model's prediction on most steps: measured 28/28 with the view, 20/28 with the
window one chunk earlier, 15/28 without sinks, 0/28 with the full context.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

pytestmark = pytest.mark.engine

CFG = {"top_k": 4, "recent_tokens": 64, "min_context": 256}


def test_view_matches_dense_reference(tiny_draft, long_prompts):
    from test_lossless import drafter, generate, make_llm, shutdown
    from transformers import AutoModelForCausalLM

    prompt = long_prompts([1200])[0]
    llm = make_llm(tiny_draft, tiny_draft, CFG, num_spec_tokens=1)
    proposer = drafter(llm)
    original = proposer.propose
    steps = []

    def record(*args, **kwargs):
        cad = kwargs["common_attn_metadata"]
        rejected = kwargs["num_rejected_tokens_gpu"]
        pos = int(cad.seq_lens[0]) - (int(rejected[0]) if rejected is not None else 0)
        draft = original(*args, **kwargs)
        entry = next(iter(proposer.store._entries.values()), None)
        if entry is not None and entry.steps_since_refresh > 0:
            chunks = entry.selected_chunks[: entry.num_selected].tolist()
            steps.append((pos, entry.window_start, chunks, int(draft[0, 0])))
        return draft

    proposer.propose = record
    output = generate(llm, [prompt], max_tokens=40)[0]
    shutdown(llm)

    sequence = prompt + output
    model = AutoModelForCausalLM.from_pretrained(tiny_draft, dtype=torch.float32).eval()
    chunk = sink = 32

    def predicts(kept, proposed):
        with torch.no_grad():
            ids = torch.tensor([[sequence[i] for i in kept]])
            logits = model(ids, position_ids=torch.tensor([kept])).logits[0, -1]
        return int(logits.argmax()) == proposed

    steps = [s for s in steps if s[0] < len(sequence)]
    assert len(steps) >= 10
    hits = {"view": 0, "window one chunk earlier": 0, "full context": 0}
    for pos, start, chunks, proposed in steps:
        retrieved = [t for c in chunks for t in range(c * chunk, (c + 1) * chunk)]
        prefix = list(range(sink)) + retrieved
        hits["view"] += predicts(prefix + list(range(start, pos + 1)), proposed)
        hits["window one chunk earlier"] += predicts(
            prefix + list(range(start - chunk, pos + 1)), proposed
        )
        hits["full context"] += predicts(list(range(pos + 1)), proposed)
    assert hits["view"] >= 0.95 * len(steps), (hits, len(steps))
    assert max(hits["window one chunk earlier"], hits["full context"]) < hits["view"]
