"""Every touch point on vLLM internals, in one place (vLLM 0.26).

==============================================  ==========  =====================================
vLLM symbol                                      how         why
==============================================  ==========  =====================================
``vllm.__version__``                            read        pin check
``EngineArgs.add_cli_args``                     wrap        add ``--spec-extend`` and aliases
``EngineArgs.create_engine_config``             wrap        validate, select our worker class
``VllmConfig.additional_config``                read        carries ``spec_extend``
``ParallelConfig.worker_cls``                   write       platform worker -> ours
``VllmConfig.use_v2_model_runner``              read        our drafters are the V1 runner's;
``  VLLM_USE_V2_MODEL_RUNNER``                  set         EAGLE on a dense model defaults to V2
``v1.worker.gpu_worker.Worker``                 subclass    install the proposer (GPU)
``v1.worker.cpu_worker.CPUWorker``              subclass    install the proposer (CPU)
``Worker.init_device`` / ``.execute_model``     override    runner exists / finished req ids
``GPUModelRunner.drafter`` / ``.input_batch``   write/read  our proposer; row -> req_id
``DraftModelProposer`` / ``EagleProposer``      subclass    draft_model / eagle(3) proposers
``  .propose``                                  override    retrieval + view per step
``  .build_per_group_and_layer_attn_metadata``  override    funnel of every draft forward
``  .load_model``                               override    hook the last target layer
``CommonAttentionMetadata`` fields              read/copy   block table, seq lens, qsl
``Attention.impl.forward`` (one instance)       wrap        capture the final-layer query
``Attention.kv_cache`` / ``impl.scale``         read        paged keys for scoring
``ops.cpu_attn_reshape_and_cache``              call        learn the CPU key page order
``Worker.determine_available_memory``           override    KV budget less the scratch blocks
``Attention.get_kv_cache_spec``                 call        draft KV bytes per block
``kv_cache_utils.max_memory_usage_bytes``       call        one request's KV (budget check)
``Worker.initialize_from_config``               override    KV allocated: add scratch blocks
``Attention.kv_cache`` / ``GPUModelRunner``     rebind      draft layers' KV with scratch blocks
``  .kv_caches``
``GPUModelRunner``                              write       drafting past the draft's length
``  .effective_drafter_max_model_len``                      (compacted positions)
``RotaryEmbedding`` / ``Llama3RotaryEmbedding``  read/write  draft RoPE: extend cos/sin cache,
                                                            inverse frequencies for re-rotation
``distributed`` TP rank, all-reduce, broadcast  call        one chunk choice across TP ranks
==============================================  ==========  =====================================

Heavy symbols (worker and proposer classes) load lazily through module
``__getattr__`` so that the plugin entry point stays cheap in the API server.
Version-specific notes carry a ``vLLM 0.26:`` tag.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch

import vllm
from vllm.logger import init_logger

SUPPORTED_VLLM = "0.26.0"
SKIP_VERSION_CHECK_ENV = "SPECEXTEND_SKIP_VERSION_CHECK"

# A child of the "vllm" logger, so vLLM's handler, format and level apply.
logger = init_logger("vllm.plugins.specextend")

_LAZY = {
    "DraftModelProposer": ("vllm.v1.spec_decode.draft_model", "DraftModelProposer"),
    "EagleProposer": ("vllm.v1.spec_decode.eagle", "EagleProposer"),
    "GPUWorkerBase": ("vllm.v1.worker.gpu_worker", "Worker"),
    "CPUWorkerBase": ("vllm.v1.worker.cpu_worker", "CPUWorker"),
    "CommonAttentionMetadata": ("vllm.v1.attention.backend", "CommonAttentionMetadata"),
    "EngineArgs": ("vllm.engine.arg_utils", "EngineArgs"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(name)


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_vllm_version(installed: str | None = None) -> None:
    """Refuse any vLLM but 0.26.x (local ``+cpu``/``+cu130`` builds pass)."""
    installed = installed or vllm.__version__
    if _release(installed)[:2] == _release(SUPPORTED_VLLM)[:2]:
        return
    message = (
        f"vllm-specextend supports vLLM {SUPPORTED_VLLM} (0.26.x); installed: "
        f"{installed}. Install vllm=={SUPPORTED_VLLM} or a matching vllm-specextend."
    )
    if os.environ.get(SKIP_VERSION_CHECK_ENV) == "1":
        logger.warning("%s Continuing because %s=1.", message, SKIP_VERSION_CHECK_ENV)
        return
    raise RuntimeError(message)


_TOUCH_POINTS = {
    "DraftModelProposer.propose": (
        "common_attn_metadata",
        "token_indices_to_sample",
        "num_rejected_tokens_gpu",
    ),
    "DraftModelProposer.build_per_group_and_layer_attn_metadata": (
        "common_attn_metadata",
        "draft_index",
    ),
    "DraftModelProposer.load_model": ("target_model",),
    "EagleProposer.propose": ("common_attn_metadata", "num_rejected_tokens_gpu"),
    "EagleProposer.build_per_group_and_layer_attn_metadata": (
        "common_attn_metadata",
        "draft_index",
    ),
    "GPUWorkerBase.init_device": (),
    "GPUWorkerBase.determine_available_memory": (),
    "GPUWorkerBase.initialize_from_config": ("kv_cache_config",),
    "GPUWorkerBase.execute_model": ("scheduler_output",),
    "EngineArgs.add_cli_args": ("parser",),
    "EngineArgs.create_engine_config": ("usage_context",),
}
_CAD_FIELDS = (
    "block_table_tensor",
    "seq_lens",
    "seq_lens_cpu_upper_bound",
    "query_start_loc",
    "query_start_loc_cpu",
    "max_seq_len",
    "_seq_lens_cpu",
    "_num_computed_tokens_cpu",
    "_num_computed_tokens_cache",
)


def check_touch_points() -> None:
    """Fail loudly if an overridden or read vLLM name moved or changed."""
    import dataclasses

    problems = []
    for qualname, params in _TOUCH_POINTS.items():
        owner, attr = qualname.split(".")
        fn = getattr(__getattr__(owner), attr, None)
        if fn is None:
            problems.append(f"{qualname} is missing")
            continue
        missing = set(params) - set(inspect.signature(fn).parameters)
        if missing:
            problems.append(f"{qualname} lacks parameters {sorted(missing)}")
    fields = {f.name for f in dataclasses.fields(__getattr__("CommonAttentionMetadata"))}
    for name in _CAD_FIELDS:
        if name not in fields:
            problems.append(f"CommonAttentionMetadata.{name} is missing")
    if problems:
        raise RuntimeError(
            "vllm-specextend does not match the installed vLLM internals: "
            + "; ".join(problems)
        )


# --- patches: the only two, each applied once --------------------------------

_PATCHED: dict[str, Callable] = {}


def patch_engine_args(
    add_args: Callable[[Any], None],
    on_config: Callable[[Any], None],
    on_args: Callable[[Any], None] = lambda args: None,
) -> None:
    """Wrap ``EngineArgs.add_cli_args`` and ``.create_engine_config``.

    vLLM 0.26 has no API for plugin CLI flags (the comment in
    ``AsyncEngineArgs.add_cli_args`` invites parser changes) and no hook before
    or after the engine config resolves: ``on_args(engine_args)`` runs before
    it, ``on_config(vllm_config)`` after. Idempotent.
    """
    engine_args = __getattr__("EngineArgs")
    if "add_cli_args" not in _PATCHED:
        original_add = engine_args.add_cli_args

        @functools.wraps(original_add)
        def add_cli_args(parser, *args, **kwargs):
            parser = original_add(parser, *args, **kwargs)
            add_args(parser)
            return parser

        _PATCHED["add_cli_args"] = original_add
        engine_args.add_cli_args = staticmethod(add_cli_args)
    if "create_engine_config" not in _PATCHED:
        original_create = engine_args.create_engine_config

        @functools.wraps(original_create)
        def create_engine_config(self, *args, **kwargs):
            on_args(self)
            vllm_config = original_create(self, *args, **kwargs)
            on_config(vllm_config)
            return vllm_config

        _PATCHED["create_engine_config"] = original_create
        engine_args.create_engine_config = create_engine_config


def unpatch_engine_args() -> None:
    engine_args = __getattr__("EngineArgs")
    if "add_cli_args" in _PATCHED:
        engine_args.add_cli_args = staticmethod(_PATCHED.pop("add_cli_args"))
    if "create_engine_config" in _PATCHED:
        engine_args.create_engine_config = _PATCHED.pop("create_engine_config")


# --- engine config --------------------------------------------------------------

PLATFORM_WORKERS = {
    "vllm.v1.worker.gpu_worker.Worker": "vllm_specextend.worker.GPUWorker",
    "vllm.v1.worker.cpu_worker.CPUWorker": "vllm_specextend.worker.CPUWorker",
}


def engine_facts(vllm_config) -> dict[str, Any]:
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
    )


def additional_config(vllm_config) -> dict[str, Any]:
    return vllm_config.additional_config or {}


def require_v1_model_runner(vllm_config) -> None:
    """Keep the V1 model runner, whose drafter our proposers replace.

    vLLM 0.26 runs dense models with ``eagle``/``eagle3`` on its V2 runner by
    default on GPU; that runner has its own speculator and ignores ours. The
    choice is re-read from the environment wherever it matters (scheduler,
    input processor, worker), and workers inherit it, so setting it here,
    before any of them exists, switches the whole engine.
    """
    if not vllm_config.use_v2_model_runner:
        return
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") is not None:
        raise ValueError(
            "--spec-extend needs vLLM's V1 model runner, but "
            "VLLM_USE_V2_MODEL_RUNNER asks for V2; unset it or set it to 0."
        )
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    if vllm_config.use_v2_model_runner:
        raise RuntimeError(
            "--spec-extend could not switch vLLM to its V1 model runner; "
            "start vLLM with VLLM_USE_V2_MODEL_RUNNER=0."
        )
    logger.info("SpecExtend: using vLLM's V1 model runner (its drafter is ours).")


def select_worker_cls(vllm_config) -> str:
    """Swap the platform's default worker for ours; refuse a foreign one."""
    parallel = vllm_config.parallel_config
    current = parallel.worker_cls
    if current in PLATFORM_WORKERS.values():
        return current
    if current not in PLATFORM_WORKERS:
        raise ValueError(
            f"--spec-extend installs its own worker, but --worker-cls={current} was "
            f"given; use one of {sorted(PLATFORM_WORKERS.values())} or drop it."
        )
    parallel.worker_cls = PLATFORM_WORKERS[current]
    return parallel.worker_cls


# --- runner and attention layers ------------------------------------------------


def batch_req_ids(runner, num_reqs: int) -> list[str]:
    return runner.input_batch.req_ids[:num_reqs]


def batch_num_prompt_tokens(runner, num_reqs: int):
    return runner.input_batch.num_prompt_tokens[:num_reqs]


def batch_seq_lens_cpu(runner, num_reqs: int):
    """This step's context lengths, an upper bound under async scheduling.

    vLLM 0.26: ``CommonAttentionMetadata.unpadded`` drops
    ``seq_lens_cpu_upper_bound``, so read the runner's source of it.
    """
    return runner.optimistic_seq_lens_cpu[:num_reqs].numpy()


def live_req_ids(runner):
    return runner.requests.keys()


def max_num_batched_tokens(vllm_config) -> int:
    return vllm_config.scheduler_config.max_num_batched_tokens


def last_target_attention(vllm_config, exclude: set[str]):
    """(name, layer) of the target's final attention layer."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.models.utils import extract_layer_index

    layers = {
        name: layer
        for name, layer in get_layers_from_vllm_config(vllm_config, Attention).items()
        if name not in exclude
    }
    if not layers:
        raise RuntimeError("vllm-specextend found no target attention layer.")
    name = max(layers, key=extract_layer_index)
    return name, layers[name]


def wrap_query_capture(layer, on_query: Callable[[torch.Tensor], None]) -> None:
    """Call ``on_query(query)`` before each ``layer.impl.forward``.

    vLLM 0.26: the attention custom op calls ``layer.impl.forward(layer, query,
    ...)`` with the post-RoPE query; wrapping this one instance keeps Dynamo out
    and leaves every other layer untouched.
    """
    impl = layer.impl
    if getattr(impl, "_specextend_wrapped", False):
        return
    forward = impl.forward

    @functools.wraps(forward)
    def capture(layer_, query, *args, **kwargs):
        on_query(query)
        return forward(layer_, query, *args, **kwargs)

    impl.forward = capture
    impl._specextend_wrapped = True


def layer_kv_cache(layer) -> torch.Tensor:
    kv_cache = layer.kv_cache
    # vLLM 0.26 binds one tensor per layer; older releases a list per engine.
    return kv_cache[0] if isinstance(kv_cache, list) else kv_cache


def cpu_key_order(layer, block_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Page offset of key element (t, d) in a CPU attention KV page.

    vLLM 0.26: CPU attention stores each (block, head) page's keys in an order
    that depends on the ISA (``vec``: [D, bs] transposed). Write known keys
    through the layer's own cache-update kernel and read back where they went.
    Values are split into two small integers so that bf16 stays exact.
    """
    impl = layer.impl
    head_size = layer.head_size
    num_elems = block_size * head_size
    ids = torch.arange(num_elems).view(1, block_size, 1, head_size)
    parts = []
    for digit in (ids % 128, ids // 128):
        cache = torch.zeros(1, 1, block_size, 2 * head_size, dtype=dtype)
        key = digit.view(block_size, 1, head_size).to(dtype)
        impl.do_kv_cache_update(
            layer, key, torch.zeros_like(key), cache, torch.arange(block_size)
        )
        parts.append(cache.view(-1)[:num_elems].to(torch.int64))
    where = parts[0] + 128 * parts[1]
    order = torch.empty(num_elems, dtype=torch.int64)
    order[where] = torch.arange(num_elems)
    if not torch.equal(torch.sort(where).values, torch.arange(num_elems)):
        raise RuntimeError("CPU KV page is not a permutation of the keys.")
    return order


def tp_rank_and_size() -> tuple[int, int]:
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


def tp_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    from vllm.distributed import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(tensor)


def tp_broadcast(tensor: torch.Tensor) -> torch.Tensor:
    """From the TP group's first rank to the others (in place)."""
    from vllm.distributed import get_tp_group

    return get_tp_group().broadcast(tensor, src=0)


def is_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def log_stats_interval() -> float:
    from vllm import envs

    return envs.VLLM_LOG_STATS_INTERVAL


# --- compacted positions --------------------------------------------------------


def max_num_seqs(vllm_config) -> int:
    return vllm_config.scheduler_config.max_num_seqs


def allow_long_drafts(runner) -> None:
    """Let the runner draft for contexts past the draft's max_model_len.

    vLLM 0.26: ``_input_fits_in_drafter`` compares the batch's max_seq_len + K
    with ``effective_drafter_max_model_len`` (set from the draft's
    max_model_len) and zeroes the drafts when it does not fit.
    """
    runner.effective_drafter_max_model_len = runner.max_model_len


def draft_ropes(model) -> list:
    """The draft's rotary embeddings; only types whose cos/sin extend exactly.

    Default and Llama-3 RoPE have position-independent inverse frequencies, so
    a longer table and re-rotation by a delta are exact. Other types (YaRN,
    dynamic NTK, ...) scale with the sequence length.
    """
    from vllm.model_executor.layers.rotary_embedding.base import (
        RotaryEmbedding,
        RotaryEmbeddingBase,
    )
    from vllm.model_executor.layers.rotary_embedding.llama3_rope import (
        Llama3RotaryEmbedding,
    )

    from vllm_specextend.config import SpecExtendConfigError

    ropes = {id(m): m for m in model.modules() if isinstance(m, RotaryEmbeddingBase)}
    if not ropes:
        raise SpecExtendConfigError(
            "spec_extend.compact_positions needs a RoPE draft; this draft has no "
            "rotary embedding. Set compact_positions to false."
        )
    for rope in ropes.values():
        if type(rope) not in (RotaryEmbedding, Llama3RotaryEmbedding):
            raise SpecExtendConfigError(
                f"spec_extend.compact_positions supports default and llama3 RoPE, "
                f"but the draft uses {type(rope).__name__}. Set compact_positions "
                "to false and use a draft whose max_model_len covers the context."
            )
    return list(ropes.values())


def extend_rope(rope, max_position: int) -> None:
    """Grow a rotary embedding's cos/sin table to ``max_position`` positions."""
    if rope.max_position_embeddings >= max_position:
        return
    old = rope.cos_sin_cache
    rope.max_position_embeddings = max_position
    rope.cos_sin_cache = rope._compute_cos_sin_cache().to(old.device, old.dtype)


def rope_inv_freq(rope) -> torch.Tensor:
    """[rotary_dim // 2] fp32 inverse frequencies (Llama-3 scaling included)."""
    return rope._compute_inv_freq(rope.base)


def kv_block_bytes(vllm_config, layer_names) -> list[tuple[int, int]]:
    """(bytes, tokens) of one KV block of each named layer, as vLLM budgets it.

    vLLM 0.26: a layer's ``get_kv_cache_spec`` is what the runner collects
    for sizing the pool; it works once the model is loaded, before the KV cache
    exists.
    """
    pages = []
    for name in layer_names:
        spec = attention_layer(vllm_config, name).get_kv_cache_spec(vllm_config)
        pages.append((spec.page_size_bytes, spec.block_size))
    return pages


def one_request_kv_bytes(runner, vllm_config) -> int | None:
    """KV bytes vLLM requires for one request of max_model_len, None when it
    fits max_model_len to the memory instead (``--max-model-len -1``).

    vLLM 0.26: ``check_enough_kv_cache_memory`` raises below this, with a
    message that only names gpu_memory_utilization and max_model_len.
    """
    from vllm.v1.core.kv_cache_utils import max_memory_usage_bytes

    if vllm_config.model_config.original_max_model_len == -1:
        return None
    return max_memory_usage_bytes(vllm_config, runner.get_kv_cache_spec().values())


def add_kv_blocks(runner, vllm_config, layer_names, num_extra: int) -> int:
    """Give each named attention layer ``num_extra`` KV blocks past the pool.

    Allocates a larger tensor with the same physical layout (stride order) and
    rebinds the layer and the runner's list entry to it; the scheduler never
    hands out the extra block ids. Must run before CUDA-graph capture, which
    bakes in tensor addresses. Returns the first extra block id.

    vLLM 0.26: ``bind_kv_cache`` sets ``layer.kv_cache`` (static forward
    context) and appends to ``runner.kv_caches``; all attention backends put
    the block dimension first in the logical shape.
    """
    first = None
    for name in layer_names:
        layer = attention_layer(vllm_config, name)
        old = layer_kv_cache(layer)
        if first is None:
            first = old.shape[0]
        elif old.shape[0] != first:
            raise RuntimeError("vllm-specextend: draft layers differ in block count.")
        order = sorted(range(old.dim()), key=lambda d: -old.stride(d))
        shape = list(old.shape)
        shape[0] += num_extra
        new = torch.zeros(
            [shape[d] for d in order], dtype=old.dtype, device=old.device
        ).permute(*[order.index(d) for d in range(old.dim())])
        new[: old.shape[0]].copy_(old)
        layer.kv_cache = new
        runner.kv_caches[:] = [new if t is old else t for t in runner.kv_caches]
    if first is None:
        raise RuntimeError("vllm-specextend found no draft attention layer.")
    return first


def kv_cache_layer_names(vllm_config) -> set[str]:
    """Names of the attention layers that own KV cache (the target's, when no
    draft model is loaded)."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
    return {
        name
        for name, layer in layers.items()
        if layer.get_kv_cache_spec(vllm_config) is not None
    }


# vLLM 0.26: slot id that attention's KV update skips (spec_decode.utils).
PADDING_SLOT_ID = -1


def attention_layer(vllm_config, name: str):
    return vllm_config.compilation_config.static_forward_context[name]
