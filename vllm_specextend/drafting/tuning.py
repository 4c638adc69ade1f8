"""The draft's kernel switches on a GPU (``DraftTuning``), read once from the
workers' environment.

Apart from the proposer, whose hooks apply them, so that each switch, its
default and the A/B behind it read in one place; a benchmark run with one set
is a variant of its mode (``benchmarks/harness/meta.py``, ``TUNING_PREFIXES``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_specextend.config.switches import env_choice


@dataclass(frozen=True)
class DraftTuning:
    """Switches for the draft's kernels on a GPU, read from the environment of
    the engine's workers (``docs/design.md``, "Switches"). Defaults, each from
    a same-session A/B on an H100 (64K, batch 1: 188-189 tok/s without both,
    190-191 with both, ``benchmarks/results/decode/20261125T22*``):

    - ``SPECEXTEND_DRAFT_ARGMAX``: ``triton`` (default; the greedy draft token
      by ``argmax_triton``, equal to ``torch.argmax`` index for index) or
      ``torch`` (vLLM's).
    - ``SPECEXTEND_DRAFT_AOT``: ``1`` (default; FA3's ahead-of-time split
      schedule for the captured routine's forwards: one scheduling kernel per
      forward instead of one per layer pass) or ``0``.
    - ``SPECEXTEND_DRAFT_ATTN_SPLITS=N``: the draft's FlashAttention split
      count (unset: vLLM's, up to 32 under CUDA graphs). The AOT schedule
      plans vLLM's bound, so a count of its own turns AOT off.
    - ``SPECEXTEND_EARLY_OUTPUT_COPY``: ``1`` (default) lets the runner's
      async output copy wait for sampling only, not for the drafter queued
      after it (``compat.model_patches.EARLY_OUTPUT_COPY``; issue #22's time to
      first token, with ``deferral.py``); ``0`` for vLLM's copy.
    """

    argmax: Callable[[torch.Tensor], torch.Tensor] | None = None
    attn_splits: int | None = None
    aot_schedule: bool = False
    early_output_copy: bool = False

    @classmethod
    def from_env(cls, device: torch.device) -> DraftTuning:
        if device.type != "cuda":
            return cls()
        argmax_name = env_choice("SPECEXTEND_DRAFT_ARGMAX", "triton", "torch")
        aot = env_choice("SPECEXTEND_DRAFT_AOT", "1", "0")
        early = env_choice("SPECEXTEND_EARLY_OUTPUT_COPY", "1", "0")
        splits = os.environ.get("SPECEXTEND_DRAFT_ATTN_SPLITS") or None
        if splits is not None and not (splits.isdigit() and int(splits) > 0):
            raise ValueError(f"SPECEXTEND_DRAFT_ATTN_SPLITS={splits!r}: use a positive "
                             "integer, or leave it unset for vLLM's split count")
        argmax = None
        if argmax_name == "triton":
            from vllm_specextend.drafting.argmax_triton import argmax_triton as argmax
        return cls(argmax=argmax, attn_splits=int(splits) if splits else None,
                   aot_schedule=aot == "1" and splits is None,
                   early_output_copy=early == "1")

