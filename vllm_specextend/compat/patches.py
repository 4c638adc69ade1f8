"""Every change SpecExtend makes to vLLM's behaviour, declared once.

Each :class:`~vllm_specextend.patching.Patch` says what it patches and why,
declared by what it patches: vLLM's start-up (``startup_patches``) and the
running engine (``model_patches``). ``PATCHES`` is the one list, and
``REGISTRY`` applies nothing else and never patches an attribute twice.
Process-wide patches are applied by :func:`apply_process_patches` (from
``plugin.register``); per-instance ones by the adapter functions below, once
the object they patch exists. Tests undo them through ``REGISTRY``.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

import torch

from vllm_specextend.compat.args import option_action
from vllm_specextend.compat.model_patches import (
    CPU_DRAFT_ATTENTION_HEADS,
    DRAFT_KV_CACHE,
    DRAFT_ROPE_TABLE,
    DRAFT_TP_GROUP,
    EARLY_OUTPUT_COPY,
    LONG_DRAFTS,
    QUERY_CAPTURE,
    RUNNER_KV_CACHES,
    STEP_SHAPE_SPECIALISATION,
)
from vllm_specextend.compat.startup_patches import (
    BRIEF_CONFIG_ERRORS,
    CHECKED_MIDDLEWARE,
    ENGINE_ARGS_BATCH_DEFAULTS,
    ENGINE_ARGS_CLI,
    ENGINE_ARGS_CONFIG,
    MERGING_ADDITIONAL_CONFIG,
    V1_MODEL_RUNNER,
    V1_MODEL_RUNNER_ENV,
    WORKER_CLS,
)
from vllm_specextend.compat.symbols import load, logger
from vllm_specextend.config import SpecExtendConfigError
from vllm_specextend.patching import PatchRegistry

PATCHES = (
    ENGINE_ARGS_CLI,
    ENGINE_ARGS_CONFIG,
    ENGINE_ARGS_BATCH_DEFAULTS,
    BRIEF_CONFIG_ERRORS,
    V1_MODEL_RUNNER,
    MERGING_ADDITIONAL_CONFIG,
    CHECKED_MIDDLEWARE,
    WORKER_CLS,
    QUERY_CAPTURE,
    LONG_DRAFTS,
    DRAFT_ROPE_TABLE,
    DRAFT_KV_CACHE,
    RUNNER_KV_CACHES,
    EARLY_OUTPUT_COPY,
    DRAFT_TP_GROUP,
    STEP_SHAPE_SPECIALISATION,
    CPU_DRAFT_ATTENTION_HEADS,
)
REGISTRY = PatchRegistry(PATCHES)


# --- adapters: apply a patch when its owner exists ---------------------------------


def apply_process_patches(
    on_parser: Callable, on_config: Callable, on_args: Callable = lambda args: None,
    on_batch_defaults: Callable = lambda args, defaults: None,
) -> None:
    """Hook vLLM's engine arguments: ``on_parser(parser)`` after each engine
    parser is built, ``on_args(engine_args)`` before and ``on_config(vllm_config)``
    after each engine config resolves, ``on_batch_defaults(engine_args,
    BatchDefaults)`` once vLLM has set its step budget. Idempotent."""
    engine_args = load("EngineArgs")
    if not REGISTRY.is_applied(ENGINE_ARGS_CLI, engine_args):
        REGISTRY.apply(ENGINE_ARGS_CLI, engine_args, on_parser)
    if not REGISTRY.is_applied(ENGINE_ARGS_CONFIG, engine_args):
        REGISTRY.apply(ENGINE_ARGS_CONFIG, engine_args, on_args, on_config)
    if not REGISTRY.is_applied(ENGINE_ARGS_BATCH_DEFAULTS, engine_args):
        REGISTRY.apply(ENGINE_ARGS_BATCH_DEFAULTS, engine_args, on_batch_defaults)


def undo_process_patches() -> None:
    engine_args = load("EngineArgs")
    for patch in (ENGINE_ARGS_CLI, ENGINE_ARGS_CONFIG, ENGINE_ARGS_BATCH_DEFAULTS):
        if REGISTRY.is_applied(patch, engine_args):
            REGISTRY.undo(patch, engine_args)


def report_errors_briefly(make_hook: Callable[[Callable], Callable]) -> None:
    """Install ``make_hook(previous_excepthook)`` once per process."""
    if not REGISTRY.is_applied(BRIEF_CONFIG_ERRORS, sys):
        REGISTRY.apply(BRIEF_CONFIG_ERRORS, sys, make_hook)


# The options whose action classes the plugin wraps, each by its declared patch.
_OPTION_PATCHES = {
    "--additional-config": MERGING_ADDITIONAL_CONFIG,
    "--middleware": CHECKED_MIDDLEWARE,
}


def wrap_option_action(parser, flag: str, make_cls: Callable[[type], type]) -> None:
    """Swap the class of ``flag``'s action for ``make_cls(its class)``, once;
    nothing when the parser has no ``flag``. Only the flags of
    ``_OPTION_PATCHES`` (KeyError for others: each change is declared)."""
    patch = _OPTION_PATCHES[flag]
    action = option_action(parser, flag)
    if action is None or REGISTRY.is_applied(patch, action):
        return
    REGISTRY.apply(patch, action, make_cls)


PLATFORM_WORKERS = {
    "vllm.v1.worker.gpu_worker.Worker": "vllm_specextend.worker.gpu.GPUWorker",
    "vllm.v1.worker.cpu_worker.CPUWorker": "vllm_specextend.worker.cpu.CPUWorker",
}
# Earlier qualnames, still importable (``vllm_specextend.worker`` re-exports).
_OUR_WORKERS = {
    *PLATFORM_WORKERS.values(),
    "vllm_specextend.worker.GPUWorker",
    "vllm_specextend.worker.CPUWorker",
}


def select_worker_cls(vllm_config) -> str:
    """Swap the platform's default worker for ours; refuse a foreign one."""
    parallel = vllm_config.parallel_config
    current = parallel.worker_cls
    if current in _OUR_WORKERS:
        return current
    _raise_if_foreign_worker(current)
    REGISTRY.apply(WORKER_CLS, parallel, PLATFORM_WORKERS[current])
    return parallel.worker_cls


def _raise_if_foreign_worker(worker_cls: str) -> None:
    if worker_cls not in PLATFORM_WORKERS:
        raise SpecExtendConfigError(
            f"--spec-extend installs its own worker, but --worker-cls={worker_cls} "
            f"was given; use one of {sorted(PLATFORM_WORKERS.values())} or drop it."
        )


def require_v1_model_runner(vllm_config) -> None:
    """Keep the V1 model runner, whose drafter our proposers replace (see
    ``V1_MODEL_RUNNER``)."""
    if not vllm_config.use_v2_model_runner:
        return
    _raise_if_v2_asked_for()
    REGISTRY.apply(V1_MODEL_RUNNER, os.environ)
    if vllm_config.use_v2_model_runner:
        raise RuntimeError(
            "--spec-extend could not switch vLLM to its V1 model runner; "
            f"start vLLM with {V1_MODEL_RUNNER_ENV}=0."
        )
    logger.info("SpecExtend: using vLLM's V1 model runner (its drafter is ours).")


def _raise_if_v2_asked_for() -> None:
    if os.environ.get(V1_MODEL_RUNNER_ENV) is not None:
        raise SpecExtendConfigError(
            f"--spec-extend needs vLLM's V1 model runner, but {V1_MODEL_RUNNER_ENV} "
            "asks for V2; unset it or set it to 0."
        )


def wrap_query_capture(layer, on_query: Callable[[torch.Tensor], None]) -> None:
    """Call ``on_query(query)`` before each ``layer.impl.forward``; once per impl."""
    if not REGISTRY.is_applied(QUERY_CAPTURE, layer.impl):
        REGISTRY.apply(QUERY_CAPTURE, layer.impl, on_query)


def allow_long_drafts(runner) -> None:
    """Let the runner draft for contexts past the draft's max_model_len."""
    if not REGISTRY.is_applied(LONG_DRAFTS, runner):
        REGISTRY.apply(LONG_DRAFTS, runner)


STEP_SHAPE_PARAMS = {
    "eagle_prepare_next_token_padded_kernel": ("num_reqs",),
    "eagle_prepare_inputs_padded_kernel": ("num_reqs",),
    "copy_and_expand_eagle_inputs_kernel": (
        "target_token_ids_ptr", "target_positions_ptr", "next_token_ids_ptr",
        "query_start_loc_ptr", "query_end_loc_ptr", "total_input_tokens"),
}
"""vLLM's spec-decode kernels, and their parameters that change from step to
step: a request or token count, an input a prompt pass slices at an offset."""


def compile_once_per_step_shape(module=None) -> int:
    """``STEP_SHAPE_SPECIALISATION`` on ``module``'s kernels (vLLM's
    ``v1.spec_decode.utils``); returns how many now compile once. It skips a
    plain function (vLLM's CPU platform turns Triton off) and, with a
    warning, a kernel that ran already (the binder of its arguments is built
    at its first launch) without the patch."""
    if module is None:
        module = importlib.import_module("vllm.v1.spec_decode.utils")
    held = 0
    for name, param_names in STEP_SHAPE_PARAMS.items():
        kernel = getattr(module, name)
        params = getattr(kernel, "params", None)
        if params is None:
            continue
        if getattr(kernel, "device_caches", None):
            if not any(REGISTRY.is_applied(STEP_SHAPE_SPECIALISATION, p)
                       for p in params):
                logger.warning(
                    "SpecExtend: vLLM's %s ran in this process before the "
                    "plugin's engine: it compiles again as steps change shape.",
                    name)
            continue
        by_name = {p.name: p for p in params}
        missing = [n for n in param_names if n not in by_name]
        if missing:
            raise RuntimeError(
                f"vllm-specextend: vLLM's {name} has no parameter "
                f"{', '.join(missing)}; this plugin supports vLLM 0.26.0 only."
            )
        for param_name in param_names:
            if not REGISTRY.is_applied(STEP_SHAPE_SPECIALISATION, by_name[param_name]):
                REGISTRY.apply(STEP_SHAPE_SPECIALISATION, by_name[param_name])
        held += 1
    return held


def draft_attention_heads(drafter) -> int:
    """``CPU_DRAFT_ATTENTION_HEADS`` on each attention builder of the draft's
    layers whose query heads are not those layers' own (a CPU worker's, once
    the drafter's attention groups exist); returns how many it set."""
    forward_context = drafter.vllm_config.compilation_config.static_forward_context
    fitted = 0
    for group in drafter.draft_attn_groups:
        heads = {forward_context[name].num_heads for name in group.layer_names}
        if len(heads) != 1:
            continue
        (own,) = heads
        for builder in group.metadata_builders:
            if getattr(builder, "num_heads", own) != own \
                    and not REGISTRY.is_applied(CPU_DRAFT_ATTENTION_HEADS, builder):
                REGISTRY.apply(CPU_DRAFT_ATTENTION_HEADS, builder, own)
                fitted += 1
    return fitted


def copy_outputs_after_sampling(runner) -> None:
    """Let the runner's async output copy wait for sampling, not the drafter."""
    if not REGISTRY.is_applied(EARLY_OUTPUT_COPY, runner):
        REGISTRY.apply(EARLY_OUTPUT_COPY, runner)


def extend_rope(rope, max_position: int) -> None:
    """Grow a rotary embedding's cos/sin table to ``max_position`` positions.

    vLLM 0.26 caches RoPE modules by their parameters (``get_rope``), so an
    engine started later in the process may share a module extended before:
    a longer table replaces the earlier extension.
    """
    if rope.max_position_embeddings >= max_position:
        return
    if REGISTRY.is_applied(DRAFT_ROPE_TABLE, rope):
        REGISTRY.undo(DRAFT_ROPE_TABLE, rope)
    REGISTRY.apply(DRAFT_ROPE_TABLE, rope, max_position)
