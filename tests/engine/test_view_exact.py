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

import pytest
import torch

pytestmark = pytest.mark.engine

CFG = {"top_k": 4, "recent_tokens": 64, "min_context": 256}


def _drafts_and_reference(tiny_draft, long_prompts, cfg):
    """Run the model drafting for itself; return its view steps
    ``(pos, window_start, chunks, proposed)`` and ``predicts(positions,
    kept_positions, proposed)``: whether the dense model proposes the same
    from the tokens at ``kept_positions`` given position ids ``positions``."""
    from cpu_engine import generate, make_llm, shutdown
    from transformers import AutoModelForCausalLM

    from benchmarks.harness.drafter import drafter, selections, stats

    prompt = long_prompts([1200])[0]
    llm = make_llm(tiny_draft, tiny_draft, cfg, num_spec_tokens=1)
    proposer = drafter(llm)
    original = proposer.propose
    steps = []

    def record(*args, **kwargs):
        cad = kwargs["common_attn_metadata"]
        rejected = kwargs["num_rejected_tokens_gpu"]
        pos = int(cad.seq_lens[0]) - (int(rejected[0]) if rejected is not None else 0)
        draft = original(*args, **kwargs)
        entry = next(iter(selections(proposer).values()), None)
        if entry is not None and entry.steps_since_refresh > 0:
            steps.append((pos, entry.window_start, entry.chunks, int(draft[0, 0])))
        return draft

    proposer.propose = record
    output = generate(llm, [prompt], max_tokens=40)[0]
    compactions = stats(proposer)["compactions"]
    shutdown(llm)

    sequence = prompt + output
    model = AutoModelForCausalLM.from_pretrained(tiny_draft, dtype=torch.float32).eval()

    def predicts(positions, kept, proposed):
        with torch.no_grad():
            ids = torch.tensor([[sequence[i] for i in kept]])
            logits = model(ids, position_ids=torch.tensor([positions])).logits[0, -1]
        return int(logits.argmax()) == proposed

    steps = [s for s in steps if s[0] < len(sequence)]
    return steps, predicts, compactions


def _kept(start, chunks, pos, chunk=32, sink=32):
    retrieved = [t for c in chunks for t in range(c * chunk, (c + 1) * chunk)]
    return list(range(sink)) + retrieved + list(range(start, pos + 1))


def test_view_matches_dense_reference(tiny_draft, long_prompts):
    steps, predicts, _ = _drafts_and_reference(tiny_draft, long_prompts, CFG)
    assert len(steps) >= 10
    hits = {"view": 0, "window one chunk earlier": 0, "full context": 0}
    for pos, start, chunks, proposed in steps:
        kept = _kept(start, chunks, pos)
        hits["view"] += predicts(kept, kept, proposed)
        earlier = _kept(start - 32, chunks, pos)
        hits["window one chunk earlier"] += predicts(earlier, earlier, proposed)
        full = list(range(pos + 1))
        hits["full context"] += predicts(full, full, proposed)
    assert hits["view"] >= 0.95 * len(steps), (hits, len(steps))
    assert max(hits["window one chunk earlier"], hits["full context"]) < hits["view"]


def test_compacted_view_matches_positions_from_zero(tiny_draft, long_prompts):
    """Forced compaction: the draft sees the kept tokens as if at positions
    0..W-1 (RoPE is shift-invariant), not at their original positions."""
    cfg = {**CFG, "compact_positions": True}
    steps, predicts, compactions = _drafts_and_reference(tiny_draft, long_prompts, cfg)
    assert len(steps) >= 10 and compactions > 0
    hits = {"positions 0..W-1": 0, "original positions": 0}
    for pos, start, chunks, proposed in steps:
        kept = _kept(start, chunks, pos)
        hits["positions 0..W-1"] += predicts(list(range(len(kept))), kept, proposed)
        hits["original positions"] += predicts(kept, kept, proposed)
    assert hits["positions 0..W-1"] >= 0.95 * len(steps), (hits, len(steps))
    assert hits["original positions"] < hits["positions 0..W-1"]
