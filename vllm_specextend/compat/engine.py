"""Reads of vLLM's resolved engine config (``VllmConfig``) and environment.

Every field SpecExtend depends on is read here, so a renamed field breaks one
function. The values feed ``settings.Settings`` and the worker; nothing here
changes vLLM (that is ``patches``).
"""

from __future__ import annotations

import copy
from typing import Any


def additional_config(vllm_config) -> dict[str, Any]:
    return vllm_config.additional_config or {}


def engine_facts(vllm_config) -> dict[str, Any]:
    """The fields of ``config.EngineFacts``, as keyword arguments."""
    spec = vllm_config.speculative_config
    return dict(
        has_speculative_config=spec is not None,
        method=None if spec is None else spec.method,
        block_size=vllm_config.cache_config.block_size,
        tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
        pipeline_parallel_size=vllm_config.parallel_config.pipeline_parallel_size,
        disable_padded_drafter_batch=bool(
            spec is not None and spec.disable_padded_drafter_batch
        ),
        max_model_len=vllm_config.model_config.max_model_len,
        draft_max_model_len=(
            None
            if spec is None or spec.draft_model_config is None
            else spec.draft_model_config.max_model_len
        ),
        num_speculative_tokens=0 if spec is None else spec.num_speculative_tokens,
        model=vllm_config.model_config.model,
        draft_model=(
            None
            if spec is None or spec.draft_model_config is None
            else spec.draft_model_config.model
        ),
        num_target_attention_layers=_num_attention_layers(vllm_config),
        data_parallel_size=_lockstep_data_parallel_size(vllm_config),
        max_num_batched_tokens=getattr(
            getattr(vllm_config, "scheduler_config", None), "max_num_batched_tokens", None
        ),
        target_position_rows=position_rows(vllm_config),
        kv_cache_dtype=vllm_config.cache_config.cache_dtype,
        draft_sample_method=getattr(spec, "draft_sample_method", "greedy"),
        draft_graph_tokens=draft_graph_tokens(vllm_config),
    )


def draft_graph_tokens(vllm_config) -> int | None:
    """The most tokens one draft forward replays as a CUDA graph; None
    where the draft runs eagerly. vLLM 0.26's drafter replays piecewise
    graphs of the compilation config's capture sizes (none where the mode's
    mixed part is NONE, as under FULL_DECODE_ONLY), which its V1 runner
    rounds up to multiples of K + 1 (keeping those within the largest) when
    decode graphs are full (``adjust_cudagraph_sizes_for_spec_decode``, run
    by the worker after engine config): at K = 12 the largest is 507 of 512.
    Computed here by that same method on a copy. The mode is the config's
    before the worker checks it against the attention backend: one that
    cannot replay uniform decode batches whole falls back to piecewise
    graphs unrounded, where this errs low by under K + 1 tokens."""
    from vllm_specextend.compat.symbols import load

    cuda_graph_mode = load("CUDAGraphMode")
    spec = vllm_config.speculative_config
    compilation = getattr(vllm_config, "compilation_config", None)
    mode = getattr(compilation, "cudagraph_mode", None)
    if (spec is None or getattr(spec, "enforce_eager", False)
            or getattr(vllm_config.model_config, "enforce_eager", False)
            or mode is None
            or mode.mixed_mode() not in (cuda_graph_mode.PIECEWISE, cuda_graph_mode.FULL)
            or not compilation.cudagraph_capture_sizes):
        return None
    query_len = 1 + spec.num_speculative_tokens
    if mode.decode_mode() == cuda_graph_mode.FULL and query_len > 1:
        # The method reassigns the two size fields: a shallow copy keeps
        # the engine's own untouched.
        compilation = copy.copy(compilation)
        try:
            compilation.adjust_cudagraph_sizes_for_spec_decode(
                query_len, vllm_config.parallel_config.tensor_parallel_size)
        except ValueError:  # vLLM refuses such an engine itself
            return None
    return compilation.max_cudagraph_capture_size


def position_rows(vllm_config) -> int:
    """Rows of the target's positions the runner hands the drafter: 3 for an
    M-RoPE target, its XD-RoPE dimensions for one of those, else 1. vLLM 0.26
    hands the drafter such positions as they are, and reduces them to one row
    only on some of its paths; the plugin's own draft inputs (the pooled
    pass, the draft routine's buffers) are one row."""
    config = getattr(vllm_config, "model_config", None)
    if getattr(config, "uses_mrope", False) is True:
        return 3
    xdrope = getattr(config, "uses_xdrope_dim", 0)
    return xdrope if isinstance(xdrope, int) and xdrope > 0 else 1


def _lockstep_data_parallel_size(vllm_config) -> int:
    """Data parallel ranks that step together: an MoE target's. vLLM 0.26
    runs a dense target's ranks as independent engines and sets each engine
    core's data_parallel_size to 1 (``v1/engine/core.py``), so the API server
    counts as they do and every process resolves the same settings."""
    size = getattr(vllm_config.parallel_config, "data_parallel_size", 1) or 1
    moe = getattr(getattr(vllm_config, "model_config", None), "is_moe", False)
    return size if moe is True else 1


def _num_attention_layers(vllm_config) -> int | None:
    """The target's attention layers as vLLM counts them (hybrid and no-op
    layers aside); None where it cannot: the layer lookup at load checks."""
    try:
        return vllm_config.model_config.get_num_layers_by_block_type(
            vllm_config.parallel_config, "attention"
        )
    except Exception:  # a config vLLM cannot count layers of
        return None


def max_num_seqs(vllm_config) -> int:
    return vllm_config.scheduler_config.max_num_seqs


def max_num_batched_tokens(vllm_config) -> int:
    return vllm_config.scheduler_config.max_num_batched_tokens


def attention_row_limit(vllm_config) -> int:
    """The most rows one attention metadata may hold.

    vLLM 0.26: FlashAttention's builder keeps its ahead-of-time schedule
    in a buffer sized for ``max(max_num_seqs, max_cudagraph_capture_size)``
    rows (``FlashAttentionMetadataBuilder.scheduler_metadata``).
    """
    capture = vllm_config.compilation_config.max_cudagraph_capture_size or 0
    return max(vllm_config.scheduler_config.max_num_seqs, capture)


def served_model_name(vllm_config) -> str:
    """The ``model_name`` label of vLLM's own Prometheus series."""
    return str(vllm_config.model_config.served_model_name)


def engine_index(vllm_config) -> int:
    """This engine's ``engine`` label: its data-parallel rank, as vLLM's
    Prometheus series count engines."""
    return getattr(vllm_config.parallel_config, "data_parallel_rank", 0) or 0


def engine_indexes(vllm_config) -> list[int]:
    """The engines an API server process reports on: one per data-parallel
    rank it fronts (its own rank behind an external load balancer)."""
    parallel = vllm_config.parallel_config
    if getattr(parallel, "data_parallel_external_lb", False):
        return [engine_index(vllm_config)]
    return list(range(getattr(parallel, "data_parallel_size", 1) or 1))


def log_stats_interval() -> float:
    from vllm import envs

    return envs.VLLM_LOG_STATS_INTERVAL


def reread_env() -> None:
    """The next engine reads vLLM's environment variables afresh (a test
    that sets one for its own engines, e.g. ``VLLM_BATCH_INVARIANT``).

    vLLM 0.26: ``EngineCore`` caches ``vllm.envs`` once an engine has started
    (``enable_envs_cache``); an in-process engine started earlier in the
    same process leaves the cache on. ``disable_envs_cache`` is vLLM's own
    reset "to isolate environments between unit tests".
    """
    from vllm import envs

    envs.disable_envs_cache()


def batch_invariant_on() -> bool:
    """vLLM's batch-invariant mode is on in this process (a worker started
    with ``VLLM_BATCH_INVARIANT=1`` turned it on; it stays on).

    vLLM 0.26: ``batch_invariant._batch_invariant_MODE``, set by
    ``enable_batch_invariant_mode``.
    """
    from vllm.model_executor.layers import batch_invariant

    return bool(batch_invariant._batch_invariant_MODE)


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def executor_supports_async(backend) -> bool:
    """Whether the executor vLLM picks for ``--distributed-executor-backend
    backend`` overlaps scheduling with the step (async scheduling).

    vLLM 0.26: ``Executor.get_class`` and its ``supports_async_scheduling``.
    ``ray`` is Ray's v2 executor, a multiprocessing executor that supports
    it, unless ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0`` picks the v1 (compiled
    DAG) one, which does not. (A server at TP=4 with Ray ran without async
    scheduling when the plugin took Ray's for the v1 executor, 2026-11-28.)
    ``None`` resolves later (``ParallelConfig``): to ``uni`` or ``mp``, or to
    ``ray`` inside a Ray placement group (Ray Serve) or with
    ``--data-parallel-backend ray``, where the ``ray`` rule holds as well
    with vLLM's default; an executor class answers for itself.
    """
    if isinstance(backend, type):
        return bool(backend.supports_async_scheduling())
    if backend == "ray":
        from vllm import envs

        return bool(envs.VLLM_USE_RAY_V2_EXECUTOR_BACKEND)
    return backend in (None, "mp", "uni", "external_launcher")
