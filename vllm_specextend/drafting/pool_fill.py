"""A pooled prompt's draft KV, grown as later selections need it.

``draft_prompt_pool`` writes the draft's KV of a long prompt only for the
sinks, the ``N`` chunks the target ranks top at the prompt's end and the
window (``prompt_pool.py``): the first token no longer waits for the draft's
pass over the whole prompt. But every later selection had to choose among
those chunks, and the chunks a copy answer reads later were often not among
them: on the real Qwen2.5-Coder pair the pool lost a third of the full
pass's accepted tokens (docs/evaluation.md, 2026-12-06).

With ``draft_pool_fill: F`` each retrieval of a pooled request also picks
the ``F`` prompt chunks the target ranks top among those without draft KV
(``selection.choose_fill``; where fewer are left, the top ones with it, whose KV is
written again), marks them allowed, and before the step drafts, one draft
forward over their tokens writes their KV (``fill_inputs``): each chunk reads
the sinks and the chunks before it in the fill, in document order. The
selection then chooses among every chunk with draft KV.

The fill's forward is vLLM's first draft forward with K = 0, as a kept pass
runs, over metadata of its own: each row's block table is the *compact* run
of its sink blocks and its chosen chunks' blocks, its query the chunks'
tokens at compact positions ``sinks .. sinks + F * chunk_size``. vLLM maps
slots through that table, so the KV lands in the chunks' real slots; the
rotary positions are then set to the tokens' real ones
(``FirstPassPositions(slots=False)``): vLLM caches keys after RoPE. Sizes are
host-known (``F`` chunks a row), the chunk ids stay on the device: no sync.

Lossless (the target verifies every draft). Pure torch and numpy; no vLLM
import (``fill_inputs`` replaces fields of the ``CommonAttentionMetadata``
it is handed).
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specextend.config.switches import env_flag
from vllm_specextend.drafting.prompt_pool import FirstPassPositions
from vllm_specextend.retrieval.retriever import FillRows
from vllm_specextend.retrieval.staging import copy_to


def fill_inputs(fill: FillRows, prompt_ids: list[torch.Tensor], cad, sink_tokens: int,
                chunk_size: int, block_size: int):
    """The draft inputs of one forward that writes the fill's chunks' KV.

    ``prompt_ids[i]``: row ``fill.rows[i]``'s prompt token ids (at least up
    to ``fill.prompt_end[i]``, on the device); ``cad``: the step's metadata
    (the real block table, rows in batch order). Each fill row queries its
    chunks' tokens but the last, at compact positions after its sinks; vLLM's
    draft model adds the last as the row's next token. Returns ``(token_ids,
    positions, next_token_ids, cad, first_pass)``: the compact positions, the
    fill's metadata, and the real positions for ``set_inputs_first_pass``."""
    m, count = fill.chunks.shape
    device = fill.chunks.device
    length = count * chunk_size  # a row's tokens, the next one included
    sink_blocks, per_chunk = sink_tokens // block_size, chunk_size // block_size
    real = (fill.chunks.long()[:, :, None] * chunk_size
            + torch.arange(chunk_size, device=device)).reshape(m, length)  # [m, L]
    ids = torch.stack([p[r] for p, r in zip(prompt_ids, real, strict=True)])  # [m, L]
    rows_d = copy_to(torch.from_numpy(fill.rows.astype(np.int64)), device)  # [m]
    table = cad.block_table_tensor[rows_d]  # [m, B]
    blocks = (fill.chunks.long()[:, :, None] * per_chunk
              + torch.arange(per_chunk, device=device)).reshape(m, -1)
    compact = torch.cat([table[:, :sink_blocks], torch.gather(table, 1, blocks)],
                        dim=1).contiguous()  # [m, sink_blocks + F * per_chunk]
    query = length - 1
    compact_pos = (sink_tokens + torch.arange(query, device=device)).repeat(m)
    qsl_cpu = torch.arange(m + 1, dtype=torch.int32) * query
    seq = sink_tokens + query
    fill_cad = cad.replace(
        query_start_loc=copy_to(qsl_cpu, device),
        query_start_loc_cpu=qsl_cpu,
        seq_lens=torch.full((m,), seq, dtype=cad.seq_lens.dtype, device=device),
        num_reqs=m,
        num_actual_tokens=m * query,
        max_query_len=query,
        max_seq_len=seq,
        block_table_tensor=compact,
        # vLLM's first pass maps the slots from the positions and the table.
        slot_mapping=torch.full((m * query,), -1, dtype=cad.slot_mapping.dtype,
                                device=device),
        causal=True,
        logits_indices_padded=None,
        num_logits_indices=None,
        positions=None,
        is_prefilling=None,
        # Per-row fields of the step's rows, none for a text model's fill.
        dcp_local_seq_lens=None,
        dcp_local_seq_lens_cpu=None,
        encoder_seq_lens=None,
        encoder_seq_lens_cpu=None,
        mm_req_doc_ranges=None,
        rswa_prefix_lens=None,
        seq_lens_cpu_upper_bound=None,
        _seq_lens_cpu=torch.full((m,), seq, dtype=torch.int32),
        _num_computed_tokens_cpu=torch.full((m,), sink_tokens, dtype=torch.int32),
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
    )
    first_pass = FirstPassPositions(
        index=torch.arange(m * length, device=device),
        positions=real.flatten(),
        rows=torch.arange(m, device=device).repeat_interleave(length),
        slots=False,
    )
    # The next tokens contiguous: vLLM's kernel reads row i's at offset i.
    return (ids[:, :-1].flatten(), compact_pos, ids[:, -1].contiguous(), fill_cad,
            first_pass)


def fill_in_graphs() -> bool:
    """``SPECEXTEND_FILL_IN_GRAPHS=1``: each fill forward within the draft's
    largest CUDA graph (``rows_per_forward``), an experiment (realpair mode
    ``spec_extend_fill8_graphs``): at batch 8 a refresh of 8 rows at a fill
    of 8 is one eager forward of 2,048 tokens, or 8 graph replays of 256.
    Measured on the real pair (H100, 2026-12-07, one run each): the replays
    ran 1.06x plain end to end against the eager forward's 1.16x, so off by
    default. Read from the workers' environment when the config is taken
    (``Reconfigurable``)."""
    return env_flag("SPECEXTEND_FILL_IN_GRAPHS",
                    "forwards within the draft's largest CUDA graph")


def rows_per_forward(row_tokens: int, max_num_tokens: int,
                     graph_tokens: int | None) -> int:
    """How many filling rows one forward takes: as many as the drafter's
    buffers hold (``max_num_tokens``), or, where ``graph_tokens`` is given
    (``fill_in_graphs``, the draft's largest CUDA graph known), as many as
    that graph holds, so each forward replays instead of running eagerly. A
    row never waits: at least one a forward."""
    budget = max_num_tokens if graph_tokens is None else min(max_num_tokens,
                                                             graph_tokens)
    return max(1, budget // row_tokens)
