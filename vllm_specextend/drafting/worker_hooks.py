"""What the plugin's worker calls on its drafter, around vLLM's own calls.

The worker (``worker.mixin``) sizes the scratch KV, adds its blocks once the
KV cache exists, compiles the plugin's kernels before vLLM's warm-up, captures
the draft routine after vLLM's capture, and forwards finished and preempted
requests; the drafter reports its counters from here too. ``WorkerHooks``
goes behind ``SpecExtendMixin`` (its base).
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specextend import compat


class WorkerHooks:
    """Goes behind ``SpecExtendMixin``: the drafter's side of the worker."""

    def scratch_bytes(self) -> int:
        """Draft KV bytes of the compaction scratch; 0 without compaction."""
        if self.compactor is None:
            return 0
        return self.compactor.scratch_bytes(self._draft_attn_layer_names)

    def add_scratch_blocks(self) -> None:
        """After the KV cache exists: scratch blocks for compacted positions."""
        if self.compactor is not None:
            self.compactor.add_blocks(
                self.runner, self._draft_attn_layer_names, self.block_size
            )

    def on_requests_done(self, req_ids) -> None:
        """Finished, aborted or preempted: their selection is stale, and
        passes kept for them run now, before their blocks are handed out."""
        if self.deferral.holds_any(req_ids):
            self._run_kept_passes()
        if getattr(self, "pools", None) is not None:
            held = [self.state.slot_of(r) for r in req_ids]
            self.pools.reset(np.array([s for s in held if s is not None], dtype=np.int64))
        self.state.release(req_ids)
        # Once the batch empties no draft step follows: publish now, or /metrics
        # would miss the last requests' counts until the next request.
        self._report(force=compat.live_req_ids(self.runner) <= set(req_ids))

    def capture_graphs(self) -> None:
        """After vLLM's own capture (the worker's warm-up): the captured draft
        routine (``DraftCapture.capture_graphs``)."""
        self.capture.capture_graphs()

    def warm_up_kernels(self) -> None:
        """The plugin's Triton kernels compiled before vLLM's warm-up (the KV
        cache in place), not inside a server's first request, where vLLM's
        JIT monitor found them (~1-3 s on an H200): the scoring kernel, the
        greedy draft argmax where it is Triton's, and vLLM's spec-decode
        kernels (``compat.warm_up_spec_decode_kernels``: the preparation of
        a step's next tokens and inputs, their copy into the draft's buffers
        for every block of tokens, and under async scheduling the runner's
        torch.compiled batch-change correction). Each through the calls a
        step makes, so each compiles the specialisation steps use. The sample
        and vLLM's kernels run on every device and rank alike (the sample's
        logits are gathered across tensor-parallel ranks), so the CPU engine
        tests run them too (not the correction: vLLM's CPU platform has no
        async scheduling)."""
        if self.cfg.policy == "cmr":  # the one policy that scores
            self.retriever.warm_up(self._max_chunks(self.cfg))
        hidden = torch.zeros(1, self.draft_model_config.get_hidden_size(),
                             dtype=self.dtype, device=self.device)  # [1, H]
        self._greedy_sample(hidden)
        compat.warm_up_spec_decode_kernels(self)

    def _report(self, force: bool = False) -> None:
        # The sweep is a backstop, not a per-step cost: run it when reporting.
        if self.reporter is not None and (force or self.reporter.due()):
            self.state.sweep(compat.live_req_ids(self.runner))
            self.stats.tracked_requests = len(self.state)
            self.stats.request_slots = self.state.num_slots_held
            self.reporter.maybe_report(force=True)
