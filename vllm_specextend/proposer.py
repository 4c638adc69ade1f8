"""vLLM's draft_model and EAGLE proposers with Cross-model Retrieval.

``SpecExtendMixin`` goes in front of a ``SpecDecodeBaseProposer`` subclass:
``SpecExtendProposer`` (``DraftModelProposer``, method ``draft_model``) and
``SpecExtendEagleProposer`` (``EagleProposer``, methods ``eagle``/``eagle3``).
Both draft through the base class's loop and metadata funnel, so the view and
compaction apply to an EAGLE head's KV as to a draft model's.

Each step, before vLLM's own drafting runs (``super().propose``):

1. Rows past prefill whose selection is due (every ``retrieve_every`` draft
   steps, and right when a prompt finishes prefilling) are scored: the target's
   final-layer query of the last accepted token, captured during verification,
   against that layer's paged keys (``scoring``), then the top-k chunks are
   chosen (``selection``).
2. A block-table view is built for every row with a selection (``view``).
3. With compacted positions (a draft with fewer positions than the target), a
   row's sink and chunk blocks are copied into its scratch blocks and their
   keys re-rotated to sit right before the recent window (``rope``,
   ``scratch``), the first time the row drafts through a new selection; the
   view then lists the scratch blocks instead. The window and new tokens keep
   their real positions, so the draft attends over contiguous positions whose
   span never exceeds its own length.

Every draft forward takes its attention metadata through
``build_per_group_and_layer_attn_metadata``; while a view is active that funnel
swaps in the view's block table and shortened ``seq_lens``. Slot mappings, and so
all KV writes, still use the real table, so the draft's KV stays complete and
prefix caching, preemption and later full-context steps remain exact.

No host-device sync: decisions use CPU lengths, selections stay on the device.
Relies on compat's proposer hooks and runner accessors.
"""

from __future__ import annotations

import numpy as np
import torch
from typing_extensions import override

from vllm_specextend import compat
from vllm_specextend.config import (
    ADDITIONAL_CONFIG_KEY,
    EngineFacts,
    SpecExtendConfig,
    SpecExtendConfigError,
    compaction_on,
)
from vllm_specextend.metrics import SpecExtendStats, StatsReporter
from vllm_specextend.scoring import block_lse
from vllm_specextend.selection import (
    chunk_mass,
    num_candidates,
    select_chunks,
    uses_view,
    window_start,
)
from vllm_specextend.scratch import ScratchBlocks, copy_shifted, scratch_nbytes
from vllm_specextend.state import RequestSelection, SelectionStore
from vllm_specextend.view import build_view, compacted_view, prefix_shift, view_offsets

logger = compat.logger


class SpecExtendMixin:
    def __init__(self, vllm_config, device: torch.device, runner=None):
        super().__init__(vllm_config, device, runner=runner)
        # The base class accepts the runner but does not keep it.
        self.runner = runner
        self.cfg = SpecExtendConfig.from_dict(
            compat.additional_config(vllm_config).get(ADDITIONAL_CONFIG_KEY)
        )
        self.store = SelectionStore()
        self.stats = SpecExtendStats()
        self.reporter: StatsReporter | None = None
        self._view: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._query_buf: torch.Tensor | None = None
        self._score_layer = None
        self._key_order: torch.Tensor | None = None
        self._step = 0
        self._tp_size = 1
        facts = EngineFacts(**compat.engine_facts(vllm_config))
        self.compact = compaction_on(self.cfg, facts)
        self._draft_len = facts.draft_max_model_len if self.compact else None
        self._min_context = self.cfg.min_view_context(
            self._draft_len, facts.num_speculative_tokens
        )
        self.scratch: ScratchBlocks | None = None
        self._draft_kv: list[torch.Tensor] = []
        self._draft_head_size = 0
        self._draft_key_orders: list[torch.Tensor | None] = []
        self._inv_freq: torch.Tensor | None = None
        self._is_neox = True
        if self.compact:
            compat.allow_long_drafts(runner)

    @override
    def load_model(self, target_model) -> None:
        # super() loads the draft and learns which attention layers are its own.
        super().load_model(target_model)
        _, layer = compat.last_target_attention(
            self.vllm_config, exclude=self._draft_attn_layer_names
        )
        self._score_layer = layer
        self._query_buf = torch.zeros(
            compat.max_num_batched_tokens(self.vllm_config),
            layer.num_heads,
            layer.head_size,
            dtype=self.dtype,
            device=self.device,
        )
        compat.wrap_query_capture(layer, self._capture_query)
        if self.compact:
            self._extend_draft_rope()
        tp_rank, self._tp_size = compat.tp_rank_and_size()
        # TP ranks count the same rows: only the first one publishes.
        self.reporter = StatsReporter(
            self.stats, compat.log_stats_interval(), logger.info, publish=tp_rank == 0
        )
        if tp_rank == 0:
            logger.info("SpecExtend enabled: %s", self.cfg)

    def _extend_draft_rope(self) -> None:
        # New tokens keep their real positions: the draft's RoPE table must
        # cover the target's context even though distances stay short.
        ropes = compat.draft_ropes(self.model)
        for rope in ropes:
            compat.extend_rope(rope, self.max_model_len)
        inv_freq = compat.rope_inv_freq(ropes[0])
        for rope in ropes[1:]:
            same = rope.is_neox_style == ropes[0].is_neox_style
            if not same or not torch.equal(compat.rope_inv_freq(rope), inv_freq):
                raise SpecExtendConfigError(
                    "spec_extend.compact_positions needs one RoPE setting across "
                    "the draft's layers; set compact_positions to false."
                )
        self._inv_freq = inv_freq.to(self.device)
        self._is_neox = ropes[0].is_neox_style

    def scratch_bytes(self) -> int:
        """Draft KV bytes ``add_scratch_blocks`` allocates; 0 without compaction.

        From the draft layers' KV specs, so the worker can take them out of the
        KV cache budget before vLLM sizes its pool. One run per schedulable
        request: a request without one could not draft past the draft's
        positions.
        """
        if not self.compact:
            return 0
        pages = compat.kv_block_bytes(
            self.vllm_config, sorted(self._draft_attn_layer_names)
        )
        return scratch_nbytes(
            pages, self.cfg.draft_budget_tokens, compat.max_num_seqs(self.vllm_config)
        )

    def add_scratch_blocks(self) -> None:
        """After the KV cache exists: scratch blocks for compacted positions,
        one run of sink + top_k chunk blocks per schedulable request."""
        if not self.compact:
            return
        per_request = self._prefix_blocks(self.cfg)
        num_runs = compat.max_num_seqs(self.vllm_config)
        names = sorted(self._draft_attn_layer_names)
        first = compat.add_kv_blocks(
            self.runner, self.vllm_config, names, per_request * num_runs
        )
        self.scratch = ScratchBlocks(first, per_request, num_runs)
        layers = [compat.attention_layer(self.vllm_config, n) for n in names]
        self._draft_kv = [compat.layer_kv_cache(layer) for layer in layers]
        self._draft_head_size = layers[0].head_size
        self._draft_key_orders = [
            compat.cpu_key_order(layer, kv.shape[2], kv.dtype)
            if kv.device.type == "cpu"
            else None
            for layer, kv in zip(layers, self._draft_kv)
        ]
        nbytes = sum(kv[first:].numel() * kv.element_size() for kv in self._draft_kv)
        reserved = self.scratch_bytes()
        if nbytes > reserved:
            # The worker reserved scratch_bytes(); more would overrun the budget.
            raise RuntimeError(
                f"vllm-specextend: scratch KV takes {nbytes} bytes but "
                f"{reserved} were reserved from the KV cache budget."
            )
        # The worker's reservation line already gave the amount at INFO.
        logger.debug(
            "SpecExtend compacted positions: draft length %s, %d scratch blocks "
            "per request x %d requests (%.1f MiB of draft KV).",
            self._draft_len,
            per_request,
            num_runs,
            nbytes / 2**20,
        )

    def _prefix_blocks(self, cfg: SpecExtendConfig) -> int:
        return cfg.draft_budget_tokens // self.block_size

    def _capture_query(self, query: torch.Tensor) -> None:
        buf = self._query_buf
        n = min(query.shape[0], buf.shape[0])
        buf[:n].copy_(query[:n].view(n, buf.shape[1], buf.shape[2]))

    def reconfigure(self, cfg: SpecExtendConfig) -> None:
        """Switch policy or parameters between runs (benchmarks reuse one
        engine); selections made under the old config are dropped."""
        if self.scratch is not None:
            needed = self._prefix_blocks(cfg)
            if needed > self.scratch.blocks_per_request:
                raise SpecExtendConfigError(
                    f"spec_extend: sink_tokens + top_k * chunk_size needs {needed} "
                    f"scratch blocks per request, the engine was started with "
                    f"{self.scratch.blocks_per_request}; start a new engine."
                )
        self.cfg = cfg
        self.store.drop(self.store)
        self._step = 0

    def on_requests_done(self, req_ids) -> None:
        """Finished, aborted or preempted: their selection is stale."""
        self.store.drop(req_ids)
        if self.scratch is not None:
            self.scratch.release(req_ids)
        # Once the batch empties no draft step follows: publish now, or /metrics
        # would miss the last requests' counts until the next request.
        self._report(force=compat.live_req_ids(self.runner) <= set(req_ids))

    @override
    def propose(
        self,
        num_speculative_tokens,
        target_token_ids,
        target_positions,
        target_hidden_states,
        next_token_ids,
        token_indices_to_sample,
        common_attn_metadata,
        sampling_metadata,
        mm_embed_inputs=None,
        num_rejected_tokens_gpu=None,
        slot_mappings=None,
    ) -> torch.Tensor:
        # Extends super(): sets the view for the funnel, then drafts as usual.
        if self.cfg.policy != "full":
            self._view = self._prepare_view(
                common_attn_metadata, token_indices_to_sample, num_rejected_tokens_gpu
            )
        try:
            return super().propose(
                num_speculative_tokens,
                target_token_ids,
                target_positions,
                target_hidden_states,
                next_token_ids,
                token_indices_to_sample,
                common_attn_metadata,
                sampling_metadata,
                mm_embed_inputs=mm_embed_inputs,
                num_rejected_tokens_gpu=num_rejected_tokens_gpu,
                slot_mappings=slot_mappings,
            )
        finally:
            self._view = None
            self._report()

    @override
    def build_per_group_and_layer_attn_metadata(
        self, common_attn_metadata, draft_index: int = 0
    ):
        # The funnel of every draft forward: read through the view, then super().
        if self._view is not None:
            common_attn_metadata = self._apply_view(common_attn_metadata)
        return super().build_per_group_and_layer_attn_metadata(
            common_attn_metadata, draft_index
        )

    def _apply_view(self, cad):
        block_table, offsets, offsets_cpu = self._view

        def minus(x):
            return None if x is None else x - offsets_cpu[: x.shape[0]]

        return cad.replace(
            block_table_tensor=block_table,
            seq_lens=cad.seq_lens - offsets,
            seq_lens_cpu_upper_bound=minus(cad.seq_lens_cpu_upper_bound),
            _seq_lens_cpu=minus(cad._seq_lens_cpu),
            _num_computed_tokens_cpu=minus(cad._num_computed_tokens_cpu),
            _num_computed_tokens_cache=None,
        )

    def _blocks_per_chunk(self) -> int:
        if self.cfg.chunk_size % self.block_size:
            raise ValueError(
                f"spec_extend.chunk_size={self.cfg.chunk_size} is not a multiple "
                f"of the draft's KV kernel block size {self.block_size}."
            )
        return self.cfg.chunk_size // self.block_size

    def _prepare_view(self, cad, token_indices_to_sample, num_rejected):
        cfg = self.cfg
        num_reqs = cad.num_reqs
        req_ids = compat.batch_req_ids(self.runner, num_reqs)
        seq = compat.batch_seq_lens_cpu(self.runner, num_reqs).astype(np.int64)
        num_prompt = compat.batch_num_prompt_tokens(self.runner, num_reqs)
        qsl = cad.query_start_loc_cpu[: num_reqs + 1].numpy()
        q_start = seq - np.diff(qsl)
        # Under async scheduling seq is optimistic by up to K accepted drafts.
        margin = self.speculative_config.num_speculative_tokens

        to_score: list[tuple[int, str, int]] = []
        for r, req_id in enumerate(req_ids):
            if q_start[r] < num_prompt[r]:
                # (Re)computing prompt tokens: new, resumed or reused request.
                self.store.drop([req_id])
                if seq[r] >= num_prompt[r] and seq[r] >= self._min_context:
                    self._plan(r, req_id, int(seq[r]) - margin, to_score)
                continue
            self.stats.decode_rows += 1
            self.stats.full_context_tokens += int(seq[r])
            entry = self.store.get(req_id)
            # All rows refresh on the same steps, so a batch pays for scoring
            # once every retrieve_every steps instead of on most steps.
            due = self._step % cfg.retrieve_every == 0 and entry is not None
            if entry is None or (due and entry.steps_since_refresh > 0):
                self.store.drop([req_id])
                if q_start[r] >= self._min_context:
                    self._plan(r, req_id, int(q_start[r]) - margin, to_score)
        self._step += 1
        if to_score:
            self._retrieve(cad, token_indices_to_sample, num_rejected, seq, to_score)
        return self._build(cad, req_ids, num_prompt, q_start, seq)

    def _plan(self, r: int, req_id: str, anchor: int, to_score: list) -> None:
        start = window_start(self.cfg, anchor)
        if not uses_view(self.cfg, start):
            return
        if self.cfg.policy == "cmr":
            to_score.append((r, req_id, start))
        else:
            self.store.put(req_id, RequestSelection(window_start=start))

    def _retrieve(self, cad, token_indices_to_sample, num_rejected, seq, to_score):
        cfg = self.cfg
        timer = self.stats.start_timer(self.device)
        rows_cpu = torch.tensor([r for r, _, _ in to_score], dtype=torch.int64)
        rows = rows_cpu.to(self.device, non_blocking=True)
        if token_indices_to_sample is None:
            last = cad.query_start_loc_cpu[1:][rows_cpu] - 1
            query_rows = last.to(self.device, non_blocking=True)
        else:
            query_rows = token_indices_to_sample[rows]
        ctx_lens = cad.seq_lens[rows]
        if num_rejected is not None:
            ctx_lens = ctx_lens - num_rejected[rows]
        layer = self._score_layer
        kv_cache = compat.layer_kv_cache(layer)
        if kv_cache.device.type == "cpu" and self._key_order is None:
            self._key_order = compat.cpu_key_order(
                layer, kv_cache.shape[2], kv_cache.dtype
            )
        bs = kv_cache.shape[2]
        max_ctx = max(int(seq[r]) for r, _, _ in to_score)
        lse = block_lse(
            self._query_buf[query_rows.long()],
            kv_cache,
            cad.block_table_tensor[rows],
            ctx_lens.to(torch.int32),
            -(-max_ctx // bs),
            layer.impl.scale,
            self._key_order,
        )
        per_chunk = self._blocks_per_chunk()
        mass = chunk_mass(lse, per_chunk)
        if self._tp_size > 1:
            # Each rank holds tp_size-th of the heads: average over all of them.
            mass = compat.tp_all_reduce(mass) / self._tp_size
        hi = torch.tensor([s // cfg.chunk_size for _, _, s in to_score])
        lo = torch.full_like(hi, cfg.sink_tokens // cfg.chunk_size)
        selected = select_chunks(
            mass, lo.to(self.device), hi.to(self.device), min(cfg.top_k, mass.shape[1])
        )
        if self._tp_size > 1:
            # Ranks must draft from the same view; do not rely on the reduction
            # being bitwise equal everywhere.
            selected = compat.tp_broadcast(selected.contiguous())
        for i, (_, req_id, start) in enumerate(to_score):
            self.store.put(
                req_id,
                RequestSelection(
                    window_start=start,
                    num_selected=min(cfg.top_k, num_candidates(cfg, start)),
                    selected_chunks=selected[i],
                ),
            )
        self.stats.retrievals += len(to_score)
        self.stats.retrieval_steps += 1
        self.stats.stop_timer(timer)

    def _build(self, cad, req_ids, num_prompt, q_start, seq):
        cfg = self.cfg
        bs = self.block_size
        per_chunk = self._blocks_per_chunk()
        sink_blocks = cfg.sink_tokens // bs
        num_reqs = len(req_ids)
        num_selected = np.zeros(num_reqs, dtype=np.int64)
        window_block = np.full(num_reqs, sink_blocks, dtype=np.int64)
        offsets = np.zeros(num_reqs, dtype=np.int32)
        first_scratch = np.full(num_reqs, -1, dtype=np.int64)
        to_compact = []
        chunks = []
        empty = None
        for r, req_id in enumerate(req_ids):
            entry = self.store.get(req_id)
            decoding = q_start[r] >= num_prompt[r]
            if entry is None or not decoding:
                if decoding:
                    self.stats.draft_context_tokens += int(seq[r])
                chunks.append(None)
                continue
            num_selected[r] = entry.num_selected
            window_block[r] = entry.window_start // bs
            offsets[r] = view_offsets(
                entry.window_start, sink_blocks, entry.num_selected, per_chunk, bs
            )
            chunks.append(entry.selected_chunks)
            if self.scratch is not None:
                first_scratch[r] = self.scratch.run_of(req_id)
                if not entry.compacted:
                    # Now, not at retrieval: the draft KV of a prompt's last
                    # chunk is written by the first drafting step.
                    to_compact.append((r, entry))
            entry.steps_since_refresh += 1
            self.stats.view_rows += 1
            self.stats.draft_context_tokens += int(seq[r] - offsets[r])
        if not offsets.any():
            return None
        width = max((c.shape[0] for c in chunks if c is not None), default=0)
        for r, c in enumerate(chunks):
            if c is None or c.shape[0] < width:
                if empty is None:
                    empty = torch.zeros(width, dtype=torch.int32, device=self.device)
                chunks[r] = empty if c is None else torch.cat([c, empty[c.shape[0] :]])
        selected = (
            torch.stack(chunks)
            if width
            else torch.zeros(num_reqs, 0, dtype=torch.int32, device=self.device)
        )
        offsets_cpu = torch.from_numpy(offsets)
        num_selected_t = torch.from_numpy(num_selected)
        view_bt, logical = build_view(
            cad.block_table_tensor,
            sink_blocks,
            num_selected_t.to(self.device, non_blocking=True),
            torch.from_numpy(window_block).to(self.device, non_blocking=True),
            selected,
            per_chunk,
        )
        if self.scratch is not None:
            prefix = sink_blocks + num_selected_t * per_chunk
            if to_compact:
                self._compact(view_bt, logical, to_compact, first_scratch, prefix, offsets)
            view_bt = compacted_view(
                view_bt,
                torch.from_numpy(first_scratch).to(self.device, non_blocking=True),
                prefix.to(self.device, non_blocking=True),
            )
        return view_bt, offsets_cpu.to(self.device, non_blocking=True), offsets_cpu

    def _compact(self, view_bt, logical, rows, first_scratch, prefix, offsets):
        """Copy the sink and chunk blocks (still real ids in ``view_bt``) of
        ``rows``, (row, selection) pairs, into their scratch blocks, keys
        re-rotated to just before the window; marks the selections compacted."""
        timer = self.stats.start_timer(self.device)
        src, dst, delta = [], [], []
        for r, entry in rows:
            entry.compacted = True
            n = int(prefix[r])
            src.append(view_bt[r, :n])
            dst.append(torch.arange(first_scratch[r], first_scratch[r] + n))
            delta.append(prefix_shift(logical[r, :n], int(offsets[r]), self.block_size))
        copy_shifted(
            self._draft_kv,
            self._draft_key_orders,
            torch.cat(src).long(),
            torch.cat(dst).to(self.device, non_blocking=True),
            torch.cat(delta),
            self._inv_freq,
            self._is_neox,
            self._draft_head_size,
        )
        self.stats.compactions += len(rows)
        self.stats.stop_timer(timer, "compaction_seconds")

    def _report(self, force: bool = False) -> None:
        # The sweep is a backstop, not a per-step cost: run it when reporting.
        if self.reporter is not None and (force or self.reporter.due()):
            live = compat.live_req_ids(self.runner)
            self.store.sweep(live)
            if self.scratch is not None:
                self.scratch.sweep(live)
            self.stats.tracked_requests = len(self.store)
            self.reporter.maybe_report(force=True)


class SpecExtendProposer(SpecExtendMixin, compat.DraftModelProposer):
    """``draft_model`` with Cross-model Retrieval."""


class SpecExtendEagleProposer(SpecExtendMixin, compat.EagleProposer):
    """``eagle`` / ``eagle3`` with Cross-model Retrieval."""


PROPOSERS = {
    "draft_model": SpecExtendProposer,
    "eagle": SpecExtendEagleProposer,
    "eagle3": SpecExtendEagleProposer,
}
