"""The proposer's side of ``lookup.py`` (``lookup_tokens``): each step's
tokens into the history, and the lookup after vLLM's drafting loop.

Every propose records its step's tokens (``_record_tokens``), whatever it
then does with them: a kept or dropped prompt pass, a cut step, a pooled
pass, K = 0. Wherever vLLM's propose drafts (``SpecExtendMixin._vllm_propose``:
the eager path, a cut step's drafting rows, the captured routine's body) it
drafts ``r = K - lookup_tokens`` tokens and ``_looked_up`` appends the
lookup's, through the rows in ``_lookup_rows`` (the step's, a cut step's
part, or the captured routine's static inputs). Inside the captured routine
the lookup is part of the graph; the record runs before the replay.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specextend import compat
from vllm_specextend.drafting.lookup import LookupRows, TokenHistory, drafted


class LookupStep:
    """Goes behind ``SpecExtendMixin`` (its base): over the mixin's
    ``history`` (None: lookup off), ``state``, ``staging``, ``runner`` and
    ``stats``; ``_prompt_ids`` from ``PooledPasses``."""

    history: TokenHistory | None = None
    _lookup_rows: LookupRows | None = None

    def _drafted(self, num_spec_tokens: int) -> int:
        """Tokens vLLM's loop drafts of the K the runner asks for."""
        if self.history is None:
            return num_spec_tokens
        return drafted(num_spec_tokens, self.cfg.lookup_tokens)

    def _count_looked_up(self, batch: int, num_spec_tokens: int) -> None:
        """A step's looked-up tokens into the stats: K - r a row (matched or
        not), by the eager path and, per replay, by ``DraftCapture``."""
        looked_up = num_spec_tokens - self._drafted(num_spec_tokens)
        self.stats.lookup_tokens += batch * looked_up

    def _record_tokens(self, step, cad, token_ids, positions, next_token_ids,
                       num_rejected) -> None:
        """The step's tokens and bonus tokens into the history, before any
        draft runs; ``step``: the host plan, None where none was made (K = 0,
        policy ``full``: the step's slots are mapped here)."""
        if self.history is None:
            return
        num_reqs = cad.num_reqs
        req_ids = compat.batch_req_ids(self.runner, num_reqs)
        if step is None:
            self.staging.begin_step(self._staging_need(num_reqs))
        slots, slots_dev = self.state.slots_for(req_ids, self.staging)
        fresh = self.history.fresh(req_ids, slots)
        if fresh:
            qsl = cad.query_start_loc_cpu[: num_reqs + 1].numpy()
            q_start = compat.batch_seq_lens_cpu(self.runner, num_reqs) - np.diff(qsl)
            for row in fresh:
                if q_start[row] > 0:  # a prefix-cache hit, a resumed request
                    self.history.fill(int(slots[row]),
                                      self._prompt_ids(row, int(q_start[row])))
        self._lookup_rows = self.history.record(
            slots_dev, token_ids, positions, next_token_ids,
            cad.query_start_loc[: num_reqs + 1], num_rejected)

    def _looked_up(self, drafts: torch.Tensor, num_spec_tokens: int) -> torch.Tensor:
        """``drafts`` [B, r] of vLLM's loop, and the lookup's K - r after them
        where this step looks up: [B, K]."""
        r = drafts.shape[1]
        if self.history is None or r >= num_spec_tokens:
            return drafts
        if not self.capture.in_body:  # replays are counted by DraftCapture
            self._count_looked_up(drafts.shape[0], num_spec_tokens)
        return self.history.extend(self._lookup_rows, drafts, num_spec_tokens - r)
