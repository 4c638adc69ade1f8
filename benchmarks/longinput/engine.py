"""In-process vLLM engines for the evaluation, and what is read from them.

One engine per kind: ``none`` (no speculation), ``draft_model`` (vLLM's draft
model with full KV, plugin off), ``spec_extend`` (the same plus
``--spec-extend``), ``spec_extend_compact`` (with ``compact_positions``:
the draft sees its working set at positions 0..W-1, as a draft trained on
short text saw its inputs) and ``self_draft`` (the target drafts for itself, no
draft model). The ``streaming`` and ``cmr`` modes share the spec_extend engine,
their ``_compact`` twins the other, and ``self_full`` / ``self_streaming`` /
``self_cmr`` (full KV, window, retrieval) the self_draft engine: between runs
the live proposer is switched with ``harness.drafter.reconfigure``, so a policy
or parameter change costs no engine start-up. ``ngram`` is vLLM's own prompt
lookup (``method: "ngram"``, plugin off): the free competitor where the output
repeats the input. Engines run in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``) to reach the drafter.
"""

from __future__ import annotations

import gc
import itertools
import os
import time
from dataclasses import dataclass, field

MODES = ("none", "draft_model", "streaming", "cmr", "streaming_compact", "cmr_compact",
         "self_full", "self_streaming", "self_cmr", "ngram")
DEFAULT_MODES = MODES[:4]
SPEC_EXTEND_MODES = MODES[2:9]
SELF_DRAFT_MODES = MODES[6:9]
KINDS = ("none", "draft_model", "spec_extend", "spec_extend_compact", "self_draft",
         "ngram")
_request_ids = itertools.count()


def engine_kind(mode: str) -> str:
    if mode in SELF_DRAFT_MODES:
        return "self_draft"
    if mode not in SPEC_EXTEND_MODES:
        return mode
    return "spec_extend_compact" if mode.endswith("_compact") else "spec_extend"


def policy(mode: str) -> str:
    """The SpecExtend policy a plugin mode runs."""
    return mode.removeprefix("self_").removesuffix("_compact")


def is_spec_extend(kind: str) -> bool:
    """The plugin drafts (its proposer can be read and reconfigured)."""
    return kind.startswith("spec_extend") or kind == "self_draft"


@dataclass
class EngineSettings:
    target: str
    draft: str | None
    num_spec_tokens: int
    dtype: str
    block_size: int
    max_model_len: int
    max_num_seqs: int
    kv_cache_memory_bytes: int
    gpu_memory_utilization: float
    enforce_eager: bool
    seed: int = 0
    max_num_batched_tokens: int | None = None
    cudagraph_sizes: list[int] = field(default_factory=list)
    # ngram: vLLM's prompt_lookup_max / prompt_lookup_min
    ngram_max: int = 4
    ngram_min: int = 2


def build(s: EngineSettings, kind: str, spec_extend: dict | None = None):
    from vllm import LLM

    # In this process: the drafter must be reachable (benchmarks.harness.drafter).
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    kwargs = dict(
        model=s.target,
        dtype=s.dtype,
        block_size=s.block_size,
        max_model_len=s.max_model_len,
        max_num_seqs=s.max_num_seqs,
        kv_cache_memory_bytes=s.kv_cache_memory_bytes,
        gpu_memory_utilization=s.gpu_memory_utilization,
        enforce_eager=s.enforce_eager,
        # Runs repeat prompts (modes, policies): a cache hit would skip prefill.
        enable_prefix_caching=False,
        seed=s.seed,
        disable_log_stats=False,
    )
    if s.max_num_batched_tokens:
        kwargs["max_num_batched_tokens"] = s.max_num_batched_tokens
    if s.cudagraph_sizes and not s.enforce_eager:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": s.cudagraph_sizes}
    if kind == "self_draft":
        # The plugin makes the target its own draft (no draft model).
        kwargs["speculative_config"] = {"num_speculative_tokens": s.num_spec_tokens}
        spec_extend = {**(spec_extend or {}), "self_draft": True}
    elif kind == "ngram":
        kwargs["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": s.num_spec_tokens,
            "prompt_lookup_max": s.ngram_max,
            "prompt_lookup_min": s.ngram_min,
        }
    elif kind != "none":
        kwargs["speculative_config"] = {
            "method": "draft_model",
            "model": s.draft,
            "num_speculative_tokens": s.num_spec_tokens,
        }
    if is_spec_extend(kind):
        kwargs["additional_config"] = {"spec_extend": spec_extend or {}}
    return LLM(**kwargs)


def shutdown(llm) -> None:
    from vllm.distributed import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    # Frees the device and the process group, so the next engine starts clean.
    cleanup_dist_env_and_memory()


@dataclass
class Batch:
    outputs: list[list[int]]
    e2e_s: float
    decode_s: float
    decode_tokens: int
    request_ids: list[str]
    # Per request: target forwards after its first token (the steps in which
    # its output grew). Tokens per forward, (len(output) - 1) / forwards, is
    # the accepted length of any drafter: vLLM's counters skip steps without
    # drafts, which prompt lookup has whenever no n-gram matches.
    forwards: list[int] = field(default_factory=list)


def generate(llm, prompts: list[list[int]], params) -> Batch:
    """Run one batch to completion, timing it from the engine loop.

    Decode time starts once every request has its first token (prefill done)
    and counts only the tokens produced after that.
    """
    engine = llm.llm_engine
    start = time.perf_counter()
    ids = [f"eval{next(_request_ids)}" for _ in prompts]
    internal = [
        engine.add_request(rid, {"prompt_token_ids": list(p)}, params)
        for rid, p in zip(ids, prompts, strict=True)
    ]
    tokens: dict[str, list[int]] = {}
    forwards = dict.fromkeys(ids, 0)
    decode_start = None
    at_decode_start = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            grown = list(out.outputs[0].token_ids)
            if tokens.get(out.request_id) and len(grown) > len(tokens[out.request_id]):
                forwards[out.request_id] += 1
            tokens[out.request_id] = grown
        if decode_start is None and len(tokens) == len(ids) and all(tokens.values()):
            decode_start = time.perf_counter()
            at_decode_start = sum(map(len, tokens.values()))
    end = time.perf_counter()
    outputs = [tokens[rid] for rid in ids]
    total = sum(map(len, outputs))
    return Batch(
        outputs=outputs,
        e2e_s=end - start,
        decode_s=end - decode_start if decode_start is not None else 0.0,
        decode_tokens=total - at_decode_start,
        request_ids=internal,
        forwards=[forwards[rid] for rid in ids],
    )
