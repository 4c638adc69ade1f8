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
With ``carry_drafts`` a uniform decode step whose rows' lookups held last
time drafts fewer tokens (``carry.py``): ``_plan_carry`` decides after the
record, ``_drafted`` answers for the step, and the captured routine keeps a
graph per draft count (``_draft_counts``).
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specextend import compat
from vllm_specextend.drafting.carry import CarrySignal
from vllm_specextend.drafting.draft_graph import uniform_decode
from vllm_specextend.drafting.lookup import LookupRows, TokenHistory, drafted


class LookupStep:
    """Goes behind ``SpecExtendMixin`` (its base): over the mixin's
    ``history`` (None: lookup off), ``state``, ``staging``, ``runner`` and
    ``stats``; ``_prompt_ids`` from ``PooledPasses``."""

    history: TokenHistory | None = None
    carry_signal: CarrySignal | None = None  # carry_drafts (None: off)
    _lookup_rows: LookupRows | None = None
    _carrying = False
    """This step drafts ``carry_drafts`` tokens (``_plan_carry``)."""

    def _drafted(self, num_spec_tokens: int) -> int:
        """Tokens vLLM's loop drafts of the K the runner asks for: the
        carried count on a step that carries, else the usual one."""
        counts = self._draft_counts(num_spec_tokens)
        return counts[-1] if self._carrying else counts[0]

    def _draft_counts(self, num_spec_tokens: int) -> tuple[int, ...]:
        """The draft counts a step at K can take, the usual one first: the
        captured routine keeps a graph for each."""
        r = drafted(num_spec_tokens, self.cfg.lookup_tokens) \
            if self.history is not None else num_spec_tokens
        carry = self.cfg.carry_drafts
        if self.carry_signal is not None and carry is not None \
                and carry < r < num_spec_tokens:
            return (r, carry)
        return (r,)

    def _plan_carry(self, step, cad, num_spec_tokens: int,
                    num_rejected: torch.Tensor | None, drafts_now: bool) -> None:
        """After ``_record_tokens``: a uniform decode step's verification into
        the carry signal, and whether this step carries (``carry.py``): it
        drafts as a decode step (``drafts_now``: no kept, cut or pooled pass)
        at a K with a carried count, and every row's last known step accepted
        a looked-up token. Only steps whose rows all decode update the signal
        (a prompt row of K + 1 tokens verified nothing): after steps that mix
        prompt chunks in, the first uniform step reads an older value."""
        self._carrying = False
        signal = self.carry_signal
        if signal is None or self._lookup_rows is None:
            return
        k, num_reqs = num_spec_tokens, cad.num_reqs
        slots = self._lookup_rows.slots
        signal.read()  # the last step's, before this one's copy is queued
        if (num_rejected is not None and step is not None and k > 0
                and uniform_decode(batch=num_reqs, k=k,
                                   num_tokens=cad.num_actual_tokens,
                                   max_query_len=cad.max_query_len,
                                   all_decoding=bool(step.drafting.all()))):
            signal.update(slots, k, num_rejected[:num_reqs])
            self._carrying = (drafts_now and len(self._draft_counts(k)) > 1
                              and signal.carries(step.slots))
        if self._carrying:
            self.stats.carried_steps += 1
        signal.proposed(slots, self._drafted(k))

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
                if self.carry_signal is not None:
                    self.carry_signal.forget(int(slots[row]))
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
