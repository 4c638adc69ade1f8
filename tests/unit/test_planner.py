"""StepPlanner: the batch-wide array decisions equal the per-row rules (no vLLM).

The reference below is the rule as the module docstring states it, one row at
a time; the planner must take the same decisions for random batches over many
steps (rows entering, prefilling in chunks, decoding, leaving).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.retrieval.planner import BatchLens, StepPlanner
from vllm_specextend.retrieval.selection import uses_view, window_start
from vllm_specextend.retrieval.state import SelectionState


class Reference:
    """Per-row planning, the way the rule reads."""

    def __init__(self, cfg, min_context, margin):
        self.cfg, self.min_context, self.margin = cfg, min_context, margin
        self.entries = {}  # req_id -> [window_start, steps_since_refresh]
        self.step = 0

    def plan(self, req_ids, seq, num_prompt, q_start):
        cfg = self.cfg
        scored = []
        due = self.step % cfg.retrieve_every == 0
        self.step += 1
        for r, req_id in enumerate(req_ids):
            if q_start[r] < num_prompt[r]:
                self.entries.pop(req_id, None)
                if seq[r] >= num_prompt[r] and seq[r] >= self.min_context:
                    self._plan(r, req_id, seq[r] - self.margin, scored)
                continue
            entry = self.entries.get(req_id)
            if entry is None or (due and entry[1] > 0):
                self.entries.pop(req_id, None)
                if q_start[r] >= self.min_context:
                    self._plan(r, req_id, q_start[r] - self.margin, scored)
        return scored

    def _plan(self, r, req_id, anchor, scored):
        start = window_start(self.cfg, int(anchor))
        if uses_view(self.cfg, start):
            self.entries[req_id] = [start, 0]
            if self.cfg.policy == "cmr":
                scored.append((r, start))

    def drafted(self, req_ids, decoding):
        for r, req_id in enumerate(req_ids):
            if decoding[r] and req_id in self.entries:
                self.entries[req_id][1] += 1


def _batches(seed, num_steps=60):
    """Random batches: requests arrive with prompts, prefill in chunks of up
    to 512, decode 1..4 tokens a step, finish, and rows get reordered."""
    rng = np.random.default_rng(seed)
    live = {}  # req_id -> [num_prompt, num_computed]
    next_id = 0
    for _ in range(num_steps):
        while len(live) < 6 and rng.random() < 0.5:
            live[f"r{next_id}"] = [int(rng.integers(50, 3000)), 0]
            next_id += 1
        ids = list(live)
        if rng.random() < 0.3:
            rng.shuffle(ids)
        seq, num_prompt, q_start = [], [], []
        for req_id in ids:
            prompt, done = live[req_id]
            step = min(512, prompt - done) if done < prompt else int(rng.integers(1, 5))
            num_prompt.append(prompt)
            q_start.append(done)
            seq.append(done + step)
            live[req_id][1] = done + step
        yield ids, np.array(seq), np.array(num_prompt), np.array(q_start)
        for req_id in ids:
            if live[req_id][1] > live[req_id][0] + 40 and rng.random() < 0.2:
                del live[req_id]
            elif rng.random() < 0.03:  # preempted: recomputes from scratch
                live[req_id][1] = 0


CONFIGS = [
    SpecExtendConfig(top_k=4, recent_tokens=64, min_context=256),
    SpecExtendConfig(top_k=2, recent_tokens=32, retrieve_every=1, min_context=0),
    SpecExtendConfig(policy="streaming", top_k=4, recent_tokens=64, min_context=300),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.policy}-{c.retrieve_every}")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_planner_matches_the_per_row_rule(cfg, seed):
    state = SelectionState(16, cfg.top_k, torch.device("cpu"))
    planner = StepPlanner(cfg, state, min_context=cfg.min_context, margin=3)
    ref = Reference(cfg, cfg.min_context, margin=3)
    known = set()
    planned = 0
    for ids, seq, num_prompt, q_start in _batches(seed):
        state.release(known - set(ids))
        ref_gone = set(ref.entries) - set(ids)
        for req_id in ref_gone:
            ref.entries.pop(req_id)
        known = set(ids)
        lens = BatchLens(seq=seq, num_prompt=num_prompt, q_start=q_start)
        slots, slots_dev = state.slots_for(ids)
        request = planner.plan(lens, slots)
        expected = ref.plan(ids, seq, num_prompt, q_start)
        assert list(zip(request.rows.tolist(), request.window_start.tolist())) == [
            (r, int(s)) for r, s in expected
        ]
        if request.rows.size:  # the retriever would complete these now
            n = request.rows.size
            state.put(slots[request.rows], request.window_start,
                      np.zeros(n, dtype=np.int64),
                      torch.zeros(n, cfg.top_k, dtype=torch.int32),
                      slots_dev[torch.from_numpy(request.rows)])
        planned += len(expected)
        for r, req_id in enumerate(ids):
            entry = ref.entries.get(req_id)
            assert state.selection(req_id) is not None if entry else True
            if entry is not None:
                assert state.selection(req_id)[0] == entry[0]
                assert state.selection(req_id)[2] == entry[1]
            else:
                assert state.selection(req_id) is None
        decoding = lens.decoding
        state.steps_since_refresh[slots[decoding & state.active[slots]]] += 1
        ref.drafted(ids, decoding)
    assert planned > 5 or cfg.policy == "streaming"


def test_margin_moves_the_window_back():
    cfg = SpecExtendConfig(top_k=1, recent_tokens=64, min_context=0, chunk_size=32)
    state = SelectionState(2, 1, torch.device("cpu"))
    lens = BatchLens(seq=np.array([1001]), num_prompt=np.array([1000]),
                     q_start=np.array([1000]))
    slots, _ = state.slots_for(["a"])
    request = StepPlanner(cfg, state, 0, margin=4).plan(lens, slots)
    assert request.window_start.tolist() == [window_start(cfg, 1000 - 4)]
