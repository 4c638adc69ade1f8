"""The step planner: which rows drop, score or keep their selection this step.

Decisions use host lengths only (the runner's optimistic ``seq_lens``, prompt
lengths, query starts), so planning never waits for the device, and they are
array operations over the batch: no per-request Python.

Per row, with ``q_start = seq - query_len``:

* ``q_start < num_prompt``: the row (re)computes prompt tokens (new, resumed or
  reused request): its selection is stale and cleared. If this step finishes
  the prompt and the context is long enough, a selection is planned from the
  prompt's end.
* otherwise the row decodes. A row without a selection, or whose selection has
  drafted at least once when a refresh is due, plans a new one. All rows
  refresh on the same steps (every ``retrieve_every``), so a batch pays for
  scoring once every ``retrieve_every`` steps instead of on most steps.

A planned selection's window starts ``window_tokens`` before the anchor (the
first query of the row, less ``margin``: under async scheduling ``seq`` is
optimistic by up to K accepted drafts). ``streaming`` selections are complete
at once; ``cmr`` rows go to the retriever.

Pure numpy; no vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.retrieval.selection import uses_view, window_start
from vllm_specextend.retrieval.state import SelectionState


@dataclass
class BatchLens:
    """Host lengths of a batch's rows, [num_reqs] int64 each."""

    seq: np.ndarray  # context length after this step (optimistic under async)
    num_prompt: np.ndarray
    q_start: np.ndarray  # first position this step computes

    @property
    def decoding(self) -> np.ndarray:
        return self.q_start >= self.num_prompt


@dataclass
class ScoreRequest:
    """Rows whose selection the retriever chooses now."""

    rows: np.ndarray  # [n] batch rows
    window_start: np.ndarray  # [n] their windows' first tokens
    pool: np.ndarray | None = None
    """[n] bool, rows that end a prompt whose draft pass is pooled
    (``draft_prompt_pool``): the retriever chooses their pool too."""


class StepPlanner:
    def __init__(self, cfg: SpecExtendConfig, state: SelectionState,
                 min_context: int, margin: int, pools=None):
        self.cfg = cfg
        self.state = state
        self.pools = pools  # prompt_pool.PromptPools, with draft_prompt_pool
        self.min_context = min_context
        self.margin = margin
        self.step = 0

    def plan(self, lens: BatchLens, slots: np.ndarray) -> ScoreRequest:
        cfg, state = self.cfg, self.state
        decoding = lens.decoding
        prefilling = ~decoding
        state.clear(slots[prefilling])
        prompt_done = prefilling & (lens.seq >= lens.num_prompt)
        pooled = None
        if self.pools is not None:
            self.pools.reset(slots[prefilling])
            pooled = prompt_done & (lens.num_prompt >= cfg.pool_min_prompt)

        due = self.step % cfg.retrieve_every == 0
        self.step += 1
        active = state.active[slots]
        refresh = ~active | (due & (state.steps_since_refresh[slots] > 0))
        refresh &= decoding
        state.clear(slots[refresh])

        anchor = np.where(decoding, lens.q_start, lens.seq) - self.margin
        plan = (prompt_done & (lens.seq >= self.min_context)) | (
            refresh & (lens.q_start >= self.min_context)
        )
        start = window_start(cfg, anchor)
        plan &= uses_view(cfg, start)
        if pooled is not None:
            # A pooled prompt's only draft KV is its pooled pass.
            plan |= pooled

        rows = np.flatnonzero(plan)
        if cfg.policy != "cmr":
            if rows.size:
                zeros = np.zeros(rows.size, dtype=np.int64)
                state.put(slots[rows], start[rows], zeros)
            rows = rows[:0]
        return ScoreRequest(rows=rows, window_start=start[rows],
                            pool=None if pooled is None else pooled[rows])

    def reset(self) -> None:
        self.step = 0
