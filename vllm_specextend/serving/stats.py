"""SpecExtend's counters (``SpecExtendStats``) and the periodic log line.

The proposer, the retriever and the compactor count into one
``SpecExtendStats`` per worker; ``COUNTERS`` and ``GAUGES`` name and describe
every field, the ``vllm:spec_extend_*`` series of ``/metrics`` (``metrics``)
and the ``SpecExtend metrics:`` line (``format_line``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

COUNTERS = {
    "retrievals": "Chunk retrievals (one per scored request).",
    "retrieval_steps": "Draft steps that ran chunk scoring (the scoring layer).",
    "view_rows": "Draft rows that attended through a restricted view.",
    "decode_rows": "Draft rows past prefill.",
    "draft_context_tokens": "Context tokens the draft attended to (decode rows).",
    "full_context_tokens": "Context tokens of the same rows in full.",
    "scoring_seconds": "Time spent scoring and selecting chunks.",
    "compactions": "Rows whose sink and chunk blocks were re-rotated (compacted positions).",
    "compaction_seconds": "Time spent copying and re-rotating those blocks.",
    "graph_steps": "Draft steps that replayed the captured draft routine.",
    "graph_fallbacks": "Draft steps that drafted eagerly although graphs are captured.",
    "deferred_prefill_passes": "Draft passes over prompt chunks run after their step "
                               "(the step sampled nothing).",
    "split_prefill_steps": "Draft steps whose prompt-chunk rows kept their pass "
                           "while the step's other rows drafted.",
    "prefill_window_rows": "Draft rows over prompt chunks that attended to the sinks "
                           "and a window only (draft_prefill_window).",
    "prompt_pieces": "Pieces of long prompt rows whose draft pass attended to the "
                     "sinks and the window before the piece only, inside a chunk "
                     "(draft_prefill_window).",
    "dropped_prefill_passes": "Draft passes over prompt chunks not run: the prompt's "
                              "draft KV comes from its pooled pass (draft_prompt_pool).",
    "pooled_prompt_passes": "Prompts whose draft KV was written for the sinks, the "
                            "pool and the window only (draft_prompt_pool).",
    "pooled_passes_alone": "Pooled prompt passes run in a draft forward of their own "
                           "(the step's first forward could not hold them).",
    "pooled_decode_steps": "Steps ending pooled prompts, any other rows decoding, "
                           "that ran those passes first, then drafted as a decode "
                           "step.",
    "pool_fills": "Prompt chunks whose draft KV a refresh added to a pooled "
                  "prompt's (draft_pool_fill; a last fill's chunks written again "
                  "included).",
    "lookup_tokens": "Draft tokens proposed by a lookup in the request's own context "
                     "instead of a draft forward (lookup_tokens).",
    "carried_steps": "Draft steps that drafted carry_drafts tokens, the lookup "
                     "proposing the rest, since every row's lookup held in its "
                     "last known step (carry_drafts).",
    "staging_waits": "Draft steps whose host waited for the GPU to copy a step's "
                     "arrays out of the pinned staging ring (every buffer still "
                     "queued): the host had run that far ahead.",
}
GAUGES = {
    "tracked_requests": "Requests holding SpecExtend selection state.",
    # A slot outlives its selection (prefill, a refresh due): a slot a finished
    # request never gave back leaks its buffers and scratch run unseen above.
    "request_slots": "Request slots held (selection buffers and, with "
                     "compacted positions, a scratch KV run each).",
}


@dataclass
class SpecExtendStats:
    retrievals: int = 0
    retrieval_steps: int = 0
    view_rows: int = 0
    decode_rows: int = 0
    draft_context_tokens: int = 0
    full_context_tokens: int = 0
    scoring_seconds: float = 0.0
    compactions: int = 0
    compaction_seconds: float = 0.0
    graph_steps: int = 0
    graph_fallbacks: int = 0
    deferred_prefill_passes: int = 0
    split_prefill_steps: int = 0
    prefill_window_rows: int = 0
    prompt_pieces: int = 0
    dropped_prefill_passes: int = 0
    pooled_prompt_passes: int = 0
    pooled_passes_alone: int = 0
    pooled_decode_steps: int = 0
    pool_fills: int = 0
    lookup_tokens: int = 0
    carried_steps: int = 0
    staging_waits: int = 0
    tracked_requests: int = 0
    request_slots: int = 0
    _pending: list = field(default_factory=list, repr=False)

    def start_timer(self, device: torch.device):
        if device.type == "cuda":
            import torch  # only the GPU timers: the metrics directory needs none

            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        return time.perf_counter()

    def stop_timer(self, start, counter: str = "scoring_seconds") -> None:
        if isinstance(start, float):
            setattr(self, counter, getattr(self, counter) + time.perf_counter() - start)
            return
        import torch  # a GPU timer (start_timer says why here)

        end = torch.cuda.Event(enable_timing=True)
        end.record()
        # Read later: elapsed_time now would stall the step on the GPU.
        self._pending.append((start, end, counter))

    def resolve_timers(self, wait: bool = False) -> None:
        """Add the device timers whose events have completed to their counters.

        The others stay pending for a later call: waiting for them would drain
        an async-scheduled pipeline once per log interval. ``wait``: wait for
        all of them (a complete count, for an RPC or a benchmark).
        """
        pending = []
        for start, end, counter in self._pending:
            if wait:
                end.synchronize()
            elif not (end.query() and start.query()):
                pending.append((start, end, counter))
                continue
            seconds = start.elapsed_time(end) / 1000.0
            setattr(self, counter, getattr(self, counter) + seconds)
        self._pending = pending

    def snapshot(self, wait: bool = True) -> dict:
        """The counters and gauges. ``wait=False`` (the periodic reporter)
        leaves device timers that are still running for a later snapshot."""
        self.resolve_timers(wait=wait)
        # Not asdict(): it deep-copies every field, the pending CUDA events too,
        # and an event cannot be copied (TypeError inside an engine step).
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not f.name.startswith("_")}


def format_line(delta: dict, now: dict) -> str:
    full = delta["full_context_tokens"]
    share = 100.0 * delta["draft_context_tokens"] / full if full else 100.0
    per = (
        1000.0 * delta["scoring_seconds"] / delta["retrieval_steps"]
        if delta["retrieval_steps"]
        else 0.0
    )
    compaction = (
        f"compaction: {1000.0 * delta['compaction_seconds'] / delta['compactions']:.3f}"
        " ms/row, "
        if delta.get("compactions")
        else ""
    )
    replays = delta.get("graph_steps", 0)
    eager = delta.get("graph_fallbacks", 0)
    # Only where graphs are captured (a count moved): why eager is logged once
    # per reason by the proposer.
    graphs = (f"draft graph: {replays}/{replays + eager} steps, "
              if replays or eager else "")
    waits = (f"staging waits: {delta['staging_waits']}, "
             if delta.get("staging_waits") else "")
    return (
        f"SpecExtend metrics: retrievals: {delta['retrievals']}, "
        f"view rows: {delta['view_rows']}/{delta['decode_rows']}, "
        f"draft context: {share:.1f}% of full, "
        f"scoring: {per:.3f} ms/step, "
        f"{compaction}{graphs}{waits}"
        f"tracked requests: {now['tracked_requests']}"
    )
