"""The compactor: compacted positions for drafts shorter than the context.

A draft with fewer positions than the target (an EAGLE head trained to 2048,
a small draft model) cannot attend at the target's positions. With compaction
the draft's working set sits at contiguous positions that end at the real one:
each row's sink and chunk blocks are copied into its own scratch blocks, their
keys re-rotated to sit right before the recent window (``rope``), and the
view lists the scratch blocks instead of the real ones (``view.compacted_view``).
The window and new tokens keep their real positions, so the draft's RoPE table
is extended to the target's length (distances stay short).

Scratch blocks are extra KV blocks past vLLM's pool in every draft attention
layer (``compat.add_kv_blocks``), ``blocks_per_request`` per request slot of
the selection state (slot s owns the run starting at ``first_block + s *
blocks_per_request``). Their bytes come out of vLLM's KV cache budget
(``scratch_bytes``, the worker's ``determine_available_memory``).

A row is compacted the first time it drafts through a new selection, not at
retrieval: the draft KV of a prompt's last chunk is written by the first
drafting step. All copies of a step go in one ``copy_shifted`` call; the index
lists are built with array operations from host lengths.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm_specextend import compat
from vllm_specextend.config import SpecExtendConfig, SpecExtendConfigError
from vllm_specextend.drafting.rope import exact_ropes
from vllm_specextend.drafting.scratch import copy_shifted, scratch_nbytes
from vllm_specextend.drafting.view import compacted_view
from vllm_specextend.retrieval.staging import HostStaging
from vllm_specextend.retrieval.state import SelectionState
from vllm_specextend.serving.stats import SpecExtendStats


class Compactor:
    def __init__(self, cfg: SpecExtendConfig, vllm_config, device: torch.device,
                 draft_len: int):
        self.cfg = cfg
        self.vllm_config = vllm_config
        self.device = device
        self.draft_len = draft_len
        self.num_runs = compat.max_num_seqs(vllm_config)
        self.first_block = -1
        self.blocks_per_request = 0
        self._draft_kv: list[torch.Tensor] = []
        self._key_orders: list[torch.Tensor | None] = []
        self._head_size = 0
        self._inv_freq: torch.Tensor | None = None
        self._is_neox = True

    def extend_rope(self, model, max_model_len: int) -> None:
        """New tokens keep their real positions: the draft's RoPE table must
        cover the target's context even though distances stay short."""
        ropes = exact_ropes(compat.rotary_embeddings(model))
        for rope in ropes:
            compat.extend_rope(rope, max_model_len)
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

    def scratch_bytes(self, layer_names) -> int:
        """Draft KV bytes ``add_blocks`` allocates, from the draft layers' KV
        specs, so the worker can take them out of the budget before vLLM sizes
        its pool. One run per request slot: a request without one could not
        draft past the draft's positions."""
        pages = compat.kv_block_bytes(self.vllm_config, sorted(layer_names))
        return scratch_nbytes(pages, self.cfg.draft_budget_tokens, self.num_runs)

    def add_blocks(self, runner, layer_names, block_size: int) -> None:
        """After the KV cache exists, before graph capture: the scratch runs."""
        names = sorted(layer_names)
        self.blocks_per_request = self.cfg.draft_budget_tokens // block_size
        self.first_block = compat.add_kv_blocks(
            runner, self.vllm_config, names, self.blocks_per_request * self.num_runs
        )
        layers = [compat.attention_layer(self.vllm_config, n) for n in names]
        self._draft_kv = [compat.layer_kv_cache(layer) for layer in layers]
        self._head_size = layers[0].head_size
        self._key_orders = [
            compat.cpu_key_order(layer, kv.shape[2], kv.dtype)
            if kv.device.type == "cpu"
            else None
            for layer, kv in zip(layers, self._draft_kv, strict=True)
        ]
        nbytes = sum(
            kv[self.first_block :].numel() * kv.element_size() for kv in self._draft_kv
        )
        reserved = self.scratch_bytes(layer_names)
        if nbytes > reserved:
            # The worker reserved scratch_bytes(); more would overrun the budget.
            raise RuntimeError(
                f"vllm-specextend: scratch KV takes {nbytes} bytes but "
                f"{reserved} were reserved from the KV cache budget."
            )
        compat.logger.debug(
            "SpecExtend compacted positions: draft length %s, %d scratch blocks "
            "per request x %d requests (%.1f MiB of draft KV).",
            self.draft_len, self.blocks_per_request, self.num_runs, nbytes / 2**20,
        )

    def allocated_bytes(self) -> int:
        """Bytes of the scratch blocks added to the draft layers' KV."""
        return sum(
            kv[self.first_block :].numel() * kv.element_size() for kv in self._draft_kv
        )

    def check_budget(self, cfg: SpecExtendConfig, block_size: int) -> None:
        """Refuse a config whose prefix needs more scratch than was allocated."""
        needed = cfg.draft_budget_tokens // block_size
        if self.first_block >= 0 and needed > self.blocks_per_request:
            raise SpecExtendConfigError(
                f"spec_extend: sink_tokens + top_k * chunk_size needs {needed} "
                f"scratch blocks per request, the engine was started with "
                f"{self.blocks_per_request}; start a new engine."
            )

    def apply(self, view_table: torch.Tensor, logical: torch.Tensor,
              on: np.ndarray, slots: np.ndarray, prefix: np.ndarray,
              offsets: np.ndarray, state: SelectionState, staging: HostStaging,
              block_size: int, stats: SpecExtendStats) -> torch.Tensor:
        """The view with the scratch runs of rows ``on`` in place of their
        prefix columns, after copying the rows drafting through a new selection.

        view_table, logical: [num_reqs, max_blocks] (real ids, logical blocks);
        on, slots, prefix (sink + chunk blocks), offsets: [num_reqs] host.
        """
        first = self.first_block + slots * self.blocks_per_request  # [num_reqs]
        rows = np.flatnonzero(on & ~state.compacted[slots])
        if rows.size:
            timer = stats.start_timer(self.device)
            counts = prefix[rows]  # [n]
            row_of = np.repeat(rows, counts)  # [total]
            col = np.arange(row_of.size) - np.repeat(np.cumsum(counts) - counts, counts)
            dst = first[row_of] + col
            row_d, col_d, dst_d, offset_d = staging.to_device(
                row_of, col, dst, offsets[row_of]
            )
            src = view_table[row_d, col_d].long()  # [total] real block ids
            delta = offset_d + (col_d - logical[row_d, col_d]) * block_size
            copy_shifted(
                self._draft_kv, self._key_orders, src, dst_d, delta,
                self._inv_freq, self._is_neox, self._head_size,
            )
            state.compacted[slots[rows]] = True
            stats.compactions += int(rows.size)
            stats.stop_timer(timer, "compaction_seconds")
        first_d, prefix_d = staging.to_device(np.where(on, first, -1), prefix)
        return compacted_view(view_table, first_d, prefix_d)
