"""The captured draft routine, the proposer's side.

``draft_graph.py`` is the capture manager: static inputs, one graph per batch
size, the per-step check. What only the proposer knows is here, in the
``DraftCapture`` it keeps beside it (as vLLM's V2 speculators keep a capture
manager beside each speculator): whether this engine can capture and how wide
the graphs' views must be (``capture_graphs``), the body they capture (vLLM's
propose over the static inputs, through a view gathered from them), and each
step's choice between replaying and drafting eagerly (``replay``).
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specextend import compat
from vllm_specextend.drafting.draft_graph import (
    MAX_GRAPH_BATCH,
    DraftGraphs,
    DraftInputs,
    blocker,
    graph_view_tokens,
)
from vllm_specextend.drafting.host_step import Step
from vllm_specextend.drafting.lookup import LookupRows, bonus_positions
from vllm_specextend.drafting.view import View, view_blocks

logger = compat.logger


class DraftCapture:
    """A proposer's captured draft routine (``proposer.capture``).

    ``graphs``: the routine per batch size; None while drafting is eager.
    ``in_body``: the body runs (captured or on static buffers): the
    proposer's hooks then run the draft's compiled pieces without their
    piecewise graphs (graphs do not nest) and apply the AOT schedule.
    """

    def __init__(self, proposer):
        self.proposer = proposer
        self.graphs: DraftGraphs | None = None
        self.in_body = False
        self._blockers: set[str] = set()  # fallback reasons logged once each

    def replay(self, step: Step, num_speculative_tokens, target_token_ids,
               target_positions, target_hidden_states, next_token_ids,
               token_indices_to_sample, cad, sampling_metadata,
               mm_embed_inputs, num_rejected) -> torch.Tensor | None:
        """The drafts from the captured routine, or None where this step
        cannot replay it (it then drafts eagerly; ``graph_fallbacks`` counts)."""
        graphs, p = self.graphs, self.proposer
        if graphs is None:
            return None
        batch = cad.num_reqs
        view_lens = step.params.view_lens(step.lens.seq)
        reason = blocker(
            batch=batch,
            num_spec_tokens=num_speculative_tokens,
            graph_k=graphs.inputs.k,
            captured=graphs.captured,
            num_tokens=cad.num_actual_tokens,
            max_query_len=cad.max_query_len,
            all_decoding=bool(step.drafting.all()),
            longest_view=int(view_lens.max()) + num_speculative_tokens + 2,
            width_tokens=graphs.width_tokens,
            greedy=p._drafts_greedily(sampling_metadata)
            and mm_embed_inputs is None,
            table_width=cad.block_table_tensor.shape[1],
            graph_table_width=graphs.inputs.table_width,
        )
        if reason is not None:
            p.stats.graph_fallbacks += 1
            if reason not in self._blockers:
                self._blockers.add(reason)
                # Once per reason: the count is in graph_fallbacks and the
                # periodic line ("draft graph: replayed/all steps").
                logger.info("SpecExtend: some draft steps run eagerly: %s "
                            "(first seen now; counted in graph_fallbacks).", reason)
            return None
        params = step.params
        (view_params,) = p.staging.to_device(np.stack([
            params.num_selected, params.window_block, params.offsets, step.slots,
        ]))
        graphs.inputs.load(
            batch, target_token_ids, target_positions, next_token_ids,
            num_rejected, cad.seq_lens, cad.block_table_tensor,
            view_params.view(4, batch), target_hidden_states,
            token_indices_to_sample, cad.slot_mapping,
        )
        p.stats.graph_steps += 1
        p._count_looked_up(batch, num_speculative_tokens)  # looked up in it
        return graphs.run(batch, p._drafted(num_speculative_tokens))

    def capture_graphs(self) -> None:
        """After vLLM's own capture (the worker's warm-up): capture the draft
        routine per batch size, or say in one line why drafting stays eager.
        ``draft_graph``: ``auto`` captures on CUDA, ``static`` runs the same
        routine uncaptured (tests, debugging), ``off`` keeps vLLM's path."""
        p = self.proposer
        mode = p.cfg.draft_graph
        capture = mode == "auto"
        if mode == "off" or (capture and p.device.type != "cuda"):
            return
        reason = self._unsupported(capture)
        if reason is not None:
            logger.info("SpecExtend: draft routine not captured (%s); drafting "
                        "through vLLM's piecewise graphs.", reason)
            return
        k = p.speculative_config.num_speculative_tokens
        table_width = compat.block_table_width(p.runner, p.kv_cache_gid)
        width = min(
            graph_view_tokens(p.cfg.working_set_tokens(k), p._min_context,
                              p.cfg.retrieve_every, k, p.block_size),
            table_width * p.block_size,
        )
        max_batch = min(compat.max_num_seqs(p.vllm_config), MAX_GRAPH_BATCH)
        hidden_width = (compat.eagle_input_width(p)
                        if p.pass_hidden_states_to_model else 0)
        inputs = DraftInputs(max_batch, k, table_width, p.device,
                             hidden_width, p.dtype)
        graphs = DraftGraphs(
            lambda batch, drafts: self._body(batch, inputs, width, drafts),
            list(range(1, max_batch + 1)), inputs, width, capture,
            capture_context=lambda: compat.capture_stream(p.device),
            draft_counts=p._draft_counts(k),
        )
        p._view_builder()
        try:
            graphs.capture()
        except Exception as e:  # noqa: BLE001 - any failure: stay on vLLM's path
            graphs.release()
            logger.warning("SpecExtend: capturing the draft routine failed (%s: "
                           "%s); drafting through vLLM's piecewise graphs.",
                           type(e).__name__, e)
            return
        self.graphs = graphs
        logger.info(
            "SpecExtend: draft routine %s for batch sizes 1-%d (K=%d, view "
            "width %d tokens, %s drafted a step).",
            "captured" if capture else "on static buffers", max_batch, k, width,
            " or ".join(map(str, graphs.draft_counts)),
        )

    def _unsupported(self, capture: bool) -> str | None:
        p = self.proposer
        if not p._graphable:
            return "self_draft drafts through the target's own graphs"
        if p.cfg.policy == "full":
            return "policy full has no bounded view"
        if p.compactor is not None:
            return "compacted positions"
        return compat.draft_graph_blocker(p.vllm_config, p.draft_attn_groups, capture)

    def _body(self, batch: int, inputs: DraftInputs, width_tokens: int,
              drafts: int) -> torch.Tensor:
        """vLLM's propose over the static inputs and a view gathered from them
        (with ``lookup_tokens``: ``drafts`` forwards, K - m or ``carry_drafts``,
        then the lookup over the history the step recorded before the
        replay); what ``DraftGraphs`` captures. [batch, k] drafts."""
        p = self.proposer
        carrying = p._carrying
        p._carrying = drafts != p._draft_counts(inputs.k)[0]
        k, n = inputs.k, batch * (inputs.k + 1)
        builder = p.view_builder
        num_selected, window_block, offsets, slots = inputs.view_params[:, :batch]
        logical = view_blocks(
            (batch, inputs.table_width), builder.sink_blocks, num_selected,
            window_block, p.state.selected_chunks[slots],
            builder.blocks_per_chunk, width=width_tokens // p.block_size,
        )
        table = inputs.block_table[:batch]
        cad = compat.decode_attn_metadata(
            query_start_loc=inputs.query_start_loc[: batch + 1],
            query_start_loc_cpu=inputs.query_start_loc_cpu[: batch + 1],
            seq_lens=inputs.seq_lens[:batch],
            num_reqs=batch,
            num_actual_tokens=n,
            max_query_len=k + 1,
            max_seq_len=width_tokens,
            block_table_tensor=table,
            slot_mapping=inputs.slot_mapping[:n],
        )
        p._view = View(torch.gather(table, 1, logical),
                       offsets.to(torch.int32), None, width_tokens)
        if p.history is not None:  # lookup_tokens: the lookup is captured too
            p._lookup_rows = LookupRows(slots, bonus_positions(
                inputs.positions[:n], cad.query_start_loc, inputs.num_rejected[:batch]))
        # An EAGLE head reads the target's hidden states and writes its KV at
        # the verified tokens' slots; a draft model needs neither.
        eagle = inputs.hidden is not None
        self.in_body = True
        try:
            return p._greedy_propose(
                k, inputs.token_ids[:n], inputs.positions[:n],
                inputs.hidden[:n] if eagle else None,
                inputs.next_token_ids[:batch],
                inputs.sample_indices[:batch] if eagle else None, cad,
                num_rejected_tokens_gpu=inputs.num_rejected[:batch],
            )
        finally:
            self.in_body = False
            p._view = p._lookup_rows = None
            p._carrying = carrying

    def drop(self) -> None:
        """The graphs read the old selection buffers: drafting goes on
        eagerly (``reconfigure`` is for benchmarks and evaluations)."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None
            logger.info("SpecExtend: reconfigured; draft graphs dropped.")
