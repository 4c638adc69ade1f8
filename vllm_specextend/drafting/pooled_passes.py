"""The steps that end a pooled prompt (``draft_prompt_pool``): the proposer's side.

A pooled row's first draft forward is its pass over the prompt's pool
(``prompt_pool.substitute``), read through a view of its own; a pass that
would overflow the drafter's buffers runs first, alone, and a step whose other
rows decode can run the passes first and then draft as a decode step
(``prompt_pool.tails``). ``PooledPasses`` goes behind ``SpecExtendMixin`` (its
base) and uses the proposer's view builder, runner and buffers.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from vllm_specextend import compat
from vllm_specextend.drafting.pool_fill import fill_inputs, rows_per_forward
from vllm_specextend.drafting.prompt_pool import fit, substitute, tails


class PooledPasses:
    """Goes behind ``SpecExtendMixin``: the pooled prompt passes of a step."""

    def _pooled_inputs(self, step, first: int, token_ids, positions,
                       token_indices_to_sample, cad, next_token_ids):
        """The draft inputs of ``cad``'s rows (batch rows ``first`` on: a cut
        step's drafting part) with the pooled rows' queries replaced by their
        pooled passes (``prompt_pool.substitute``), and the view of the first
        forward. Rows whose pass would overflow the drafter's buffers run it
        first, each alone (``_pre_pass``), and keep their window's part."""
        pool = step.pool
        query_lens = np.diff(cad.query_start_loc_cpu[: cad.num_reqs + 1].numpy())
        pool.full = fit(pool.shifted(first), cad.num_actual_tokens, query_lens,
                        cad.num_reqs, self.max_num_tokens)
        prompt_ids = self._pool_prompt_ids(pool, token_ids, cad, first)
        alone = np.flatnonzero(~pool.full)
        if alone.size:
            self.stats.pooled_passes_alone += int(alone.size)
            self._pre_passes(step, alone.tolist(), first, prompt_ids, token_ids,
                             positions, cad, next_token_ids)
        first_view = None
        if pool.full.any():
            full = pool.take(pool.full)
            first_view = self.view_builder.pooled_pass(
                step.params, full, step.slots_dev, step.block_table
            ).rows(first, first + cad.num_reqs)
        *inputs, self._first_pass = substitute(
            pool.shifted(first), prompt_ids, token_ids, positions,
            token_indices_to_sample, cad, self.block_size, self.extra_slots_per_request)
        return (*inputs, first_view)

    def _drafts_as_decode(self, step, cad, num_speculative_tokens,
                          mm_embed_inputs) -> bool:
        """Whether a step that ends pooled prompts drafts as a decode step
        (``prompt_pool.tails``): a draft model (no target hidden states), and
        every other row decodes with K + 1 verified tokens
        (``POOLED_DECODE_STEPS``)."""
        if (not POOLED_DECODE_STEPS or self.pass_hidden_states_to_model
                or mm_embed_inputs is not None
                or num_speculative_tokens == 0 or not step.drafting.all()):
            return False
        query_lens = np.diff(cad.query_start_loc_cpu[: cad.num_reqs + 1].numpy())
        pooled = np.zeros(cad.num_reqs, dtype=bool)
        pooled[step.pool.rows] = True
        k1 = num_speculative_tokens + 1
        return bool((query_lens[~pooled] == k1).all()
                    and (query_lens[pooled] >= k1).all())

    def _pass_then_tails(self, step, num_speculative_tokens, token_ids, positions,
                         token_indices_to_sample, cad, next_token_ids, num_rejected):
        """Each pooled row's pass alone (``_pre_pass``), then the step's inputs
        cut to every row's last K + 1 tokens and its rejected counts (a pooled
        row rejects none; vLLM passes None where no row had drafts)."""
        self._pre_passes(step, range(step.pool.rows.size), 0,
                         self._pool_prompt_ids(step.pool, token_ids, cad, 0),
                         token_ids, positions, cad, next_token_ids)
        if num_rejected is None:
            num_rejected = torch.zeros(cad.num_reqs, dtype=torch.int32,
                                       device=token_ids.device)
        self.stats.pooled_decode_steps += 1
        return (*tails(token_ids, positions, token_indices_to_sample, cad,
                       num_speculative_tokens + 1), num_rejected)

    def _pool_prompt_ids(self, pool, token_ids, cad, first: int) -> list[torch.Tensor]:
        """Each pooled row's token ids up to its ``seq``, on the device: those
        before this step from the runner's host copy, its query's from
        ``token_ids`` (the step's, ``cad``'s rows counted from batch row
        ``first``). A prompt's last token can be scheduled with draft tokens
        past the prompt's end; the host copy holds placeholders (-1) there,
        the step's tokens the real ids (the CPU soak's engine death, CI runs
        62 and 63, 2026-11-29)."""
        qsl = cad.query_start_loc_cpu
        ids = []
        for row, q_start in zip(pool.rows.tolist(), pool.q_start.tolist(), strict=True):
            r = row - first
            query = token_ids[int(qsl[r]): int(qsl[r + 1])].to(torch.int64)
            ids.append(torch.cat([self._prompt_ids(row, int(q_start)), query]))
        return ids

    def _pre_passes(self, step, which, first, prompt_ids, token_ids, positions, cad,
                    next_token_ids) -> None:
        """The passes of pooled rows ``which`` (indices into ``step.pool``),
        each alone (``_pre_pass``), through one view in which every pooled
        row reads its pool."""
        pool = step.pool
        every = dataclasses.replace(pool, full=np.ones(pool.rows.size, dtype=bool))
        view = self.view_builder.pooled_pass(step.params, every, step.slots_dev,
                                             step.block_table)
        for i in which:
            self._pre_pass(view, pool, i, first, prompt_ids[i], token_ids, positions,
                           cad, next_token_ids)

    def _pre_pass(self, view, pool, i, first, prompt_ids, token_ids, positions,
                  cad, next_token_ids) -> None:
        """Pooled row ``i``'s pass alone, as a kept pass runs (K = 0), before
        the step's own forwards; ``view``: the batch's view with every pooled
        row reading its pool."""
        row = int(pool.rows[i]) - first
        one = cad
        if row > 0:
            _, one = compat.split_rows(one, self.runner, row)
        if one.num_reqs > 1:
            one, _ = compat.split_rows(one, self.runner, 1)
        qsl = cad.query_start_loc_cpu
        tokens = slice(int(qsl[row]), int(qsl[row + 1]))
        alone = dataclasses.replace(pool.take([i]).shifted(int(pool.rows[i])),
                                    full=np.ones(1, dtype=bool))
        token_ids, positions, _, one, self._first_pass = substitute(
            alone, [prompt_ids], token_ids[tokens], positions[tokens], None, one,
            self.block_size, self.extra_slots_per_request)
        saved = self._view
        self._view, self._first_view = None, view.rows(row + first, row + first + 1)
        try:
            self._first_pass_only(token_ids, positions,
                                  next_token_ids[row:row + 1], one)
        finally:
            self._view = saved
            self._first_view = self._first_pass = None

    def _fill_pools(self, step, cad) -> None:
        """The draft's KV of the chunks the step's retrieval added to pools
        (``draft_pool_fill``, ``pool_fill.py``): forwards with K = 0, as a
        kept pass runs, before the step drafts, each of as many rows as the
        drafter's buffers hold (``rows_per_forward``). ``step`` None: no plan."""
        fill = None if step is None else step.fill
        if fill is None:
            return
        graph = self.settings.facts.draft_graph_tokens if self._fill_in_graphs else None
        rows = rows_per_forward(fill.chunks.shape[1] * self.cfg.chunk_size,
                                self.max_num_tokens, graph)
        for start in range(0, fill.rows.size, rows):
            self._fill_forward(fill.take(slice(start, start + rows)), step.slots, cad)
        self.stats.pool_fills += int(fill.chunks.numel())

    def _fill_forward(self, fill, slots, cad) -> None:
        """One forward over ``fill``'s rows' chunks. Their prompts' ids from
        the lookup's history where it keeps one (on the device already), else
        from the runner's host copy."""
        if self.history is not None:
            prompt_ids = [self.history.tokens[int(slots[r])] for r in fill.rows]
        else:
            prompt_ids = [self._prompt_ids(int(r), int(end)) for r, end
                          in zip(fill.rows, fill.prompt_end, strict=True)]
        # Before the step sets a view: the fill's forward reads its own table.
        token_ids, positions, next_ids, one, self._first_pass = fill_inputs(
            fill, prompt_ids, cad, self.cfg.sink_tokens, self.cfg.chunk_size,
            self.block_size)
        try:
            self._first_pass_only(token_ids, positions, next_ids, one)
        finally:
            self._first_pass = None

    def _prompt_ids(self, row: int, seq: int) -> torch.Tensor:
        """Batch row ``row``'s first ``seq`` token ids, on the device."""
        ids = torch.from_numpy(compat.row_token_ids(self.runner, row, seq)
                               .astype(np.int64))
        if self.device.type == "cuda":
            ids = ids.pin_memory().to(self.device, non_blocking=True)
        return ids


POOLED_DECODE_STEPS = True
"""Whether a step that ends pooled prompts, any other rows decoding, drafts
as a decode step (``_drafts_as_decode``; 3edf47b). It was off for some hours: in
two CI runs (2026-11-29) the CPU soak's server died in this path's pre-pass,
an input id out of the draft's vocabulary at its embedding (``benchmarks/
results/ci/20261129T1549Z_cpu_ci62_soak_engine_death.txt``): draft-token
placeholders read as a pooled row's ids. Fixed in ``_pool_prompt_ids``
(5bed24a; its test: ``test_a_pooled_rows_ids_never_read_draft_placeholders``);
on again in b612bb7, whose clean CI runs 67 and 68 ran the soak with it and
passed (``benchmarks/results/ci/20261128T1004Z_cpu_clean_ci_runs.txt``).
Off, such steps draft through ``_pooled_inputs``."""
