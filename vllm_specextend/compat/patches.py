"""Every change SpecExtend makes to vLLM's behaviour, declared once.

Each :class:`~vllm_specextend.patching.Patch` below says what it patches and
why; ``PATCHES`` is the one list, and ``REGISTRY`` applies nothing else and
never patches an attribute twice. Process-wide patches are applied by
:func:`apply_process_patches` (from ``plugin.register``); per-instance ones by
the adapter functions below, once the object they patch exists. Tests undo
them through ``REGISTRY``.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from vllm_specextend.compat.args import option_action
from vllm_specextend.compat.symbols import load, logger
from vllm_specextend.config import SpecExtendConfigError
from vllm_specextend.patching import Patch, PatchRegistry

# --- process-wide ----------------------------------------------------------------


def _then(original: Callable, hook: Callable[[Any], None]) -> Callable:
    """``original``, then ``hook(its result)``; returns that result."""

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        hook(result)
        return result

    return wrapped


ENGINE_ARGS_CLI = Patch(
    name="EngineArgs.add_cli_args",
    target="vllm.engine.arg_utils.EngineArgs.add_cli_args",
    why="vLLM 0.26 has no API for plugin CLI flags (AsyncEngineArgs.add_cli_args "
    "invites parser changes): every engine parser gets --spec-extend and the "
    "--speculative-model aliases.",
    attrs=("add_cli_args",),
    replace=lambda engine_args, on_parser: {
        "add_cli_args": staticmethod(_then(engine_args.add_cli_args, on_parser))
    },
)


def _around_create(original: Callable, on_args: Callable, on_config: Callable) -> Callable:
    """``on_args(engine_args)``, ``original``, then ``on_config(vllm_config)``."""

    @functools.wraps(original)
    def create_engine_config(self, *args, **kwargs):
        on_args(self)
        vllm_config = original(self, *args, **kwargs)
        on_config(vllm_config)
        return vllm_config

    return create_engine_config


ENGINE_ARGS_CONFIG = Patch(
    name="EngineArgs.create_engine_config",
    target="vllm.engine.arg_utils.EngineArgs.create_engine_config",
    why="vLLM has no hook before or after the engine config resolves: before, "
    "self_draft fills in the speculative config it implies (the target drafts "
    "for itself); after, SpecExtend validates the config, before any engine "
    "process starts, and picks its worker.",
    attrs=("create_engine_config",),
    replace=lambda engine_args, on_args, on_config: {
        "create_engine_config": _around_create(
            engine_args.create_engine_config, on_args, on_config
        )
    },
)

BRIEF_CONFIG_ERRORS = Patch(
    name="sys.excepthook",
    target="sys.excepthook (processes that build vLLM's CLI parser)",
    why="An engine-time config error reaches `vllm serve`'s top level as an "
    "uncaught exception under ~40 lines of traceback; report it in one line, as "
    "argparse reports parse-time errors. Other exceptions go to the old hook.",
    attrs=("excepthook",),
    replace=lambda sys_, make_hook: {"excepthook": make_hook(sys_.excepthook)},
)

V1_MODEL_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
V1_MODEL_RUNNER = Patch(
    name="env.VLLM_USE_V2_MODEL_RUNNER",
    target="os.environ['VLLM_USE_V2_MODEL_RUNNER']",
    why="vLLM 0.26 runs dense models with eagle/eagle3 on its V2 runner by "
    "default on GPU; that runner has its own speculator and ignores ours. The "
    "choice is re-read from the environment wherever it matters (scheduler, "
    "input processor, worker) and workers inherit it, so setting it before any "
    "of them exists switches the whole engine to the V1 runner.",
    attrs=(V1_MODEL_RUNNER_ENV,),
    replace=lambda environ: {V1_MODEL_RUNNER_ENV: "0"},
    items=True,
    adds=True,
)

# --- per instance ----------------------------------------------------------------

MERGING_ADDITIONAL_CONFIG = Patch(
    name="additional_config_action.__class__",
    target="the --additional-config argparse action of each engine parser",
    why="--spec-extend fills additional_config['spec_extend']; vLLM's action "
    "for --additional-config would replace the whole dict when given after it.",
    attrs=("__class__",),
    replace=lambda action, make_cls: {"__class__": make_cls(type(action))},
    per_instance=True,
)

CHECKED_MIDDLEWARE = Patch(
    name="middleware_action.__class__",
    target="the --middleware argparse action of `vllm serve`'s parser",
    why="vLLM builds --middleware classes on the server's first ASGI event, where "
    "uvicorn's lifespan 'auto' swallows their errors: a missing API key would "
    "start a server answering 500 everywhere. Naming the plugin's middleware "
    "checks the key when the arguments are parsed instead, a usage error.",
    attrs=("__class__",),
    replace=lambda action, make_cls: {"__class__": make_cls(type(action))},
    per_instance=True,
)

WORKER_CLS = Patch(
    name="ParallelConfig.worker_cls",
    target="vllm.config.ParallelConfig.worker_cls (each engine config)",
    why="vLLM builds the platform's worker from this qualname; ours installs the "
    "proposer. The same as passing --worker-cls, chosen for the platform.",
    attrs=("worker_cls",),
    replace=lambda parallel, qualname: {"worker_cls": qualname},
    per_instance=True,
)


def _capture_before_forward(impl, on_query: Callable[[torch.Tensor], None]) -> dict:
    forward = impl.forward

    @functools.wraps(forward)
    def capture(layer, query, *args, **kwargs):
        on_query(query)  # [num_tokens, num_heads * head_size], post-RoPE
        return forward(layer, query, *args, **kwargs)

    return {"forward": capture}


QUERY_CAPTURE = Patch(
    name="Attention.impl.forward",
    target="impl.forward of the target's scoring attention layer (score_layer)",
    why="Chunks are scored with that layer's post-RoPE query. vLLM 0.26's "
    "attention custom op calls layer.impl.forward(layer, query, ...); wrapping "
    "this one instance keeps Dynamo out and leaves every other layer untouched.",
    attrs=("forward",),
    replace=_capture_before_forward,
    per_instance=True,
)

LONG_DRAFTS = Patch(
    name="GPUModelRunner.effective_drafter_max_model_len",
    target="GPUModelRunner.effective_drafter_max_model_len (each runner)",
    why="vLLM 0.26's _input_fits_in_drafter zeroes the drafts once max_seq_len + "
    "K passes the draft's max_model_len; with compacted positions the draft "
    "spans a bounded working set, so it may draft up to the target's length.",
    attrs=("effective_drafter_max_model_len",),
    replace=lambda runner: {"effective_drafter_max_model_len": runner.max_model_len},
    per_instance=True,
)


def _longer_rope_table(rope, max_position: int) -> dict:
    # vLLM 0.26: _compute_cos_sin_cache sizes the table from
    # max_position_embeddings; set it only for the computation, the registry
    # writes both attributes afterwards.
    old_len, old_cache = rope.max_position_embeddings, rope.cos_sin_cache
    rope.max_position_embeddings = max_position
    try:
        # [max_position, rotary_dim]
        cache = rope._compute_cos_sin_cache().to(old_cache.device, old_cache.dtype)
    finally:
        rope.max_position_embeddings = old_len
    return {"max_position_embeddings": max_position, "cos_sin_cache": cache}


DRAFT_ROPE_TABLE = Patch(
    name="RotaryEmbedding.cos_sin_cache",
    target="max_position_embeddings and cos_sin_cache of each draft RoPE module",
    why="With compacted positions new tokens keep their real positions, so the "
    "draft's cos/sin table must cover the target's context although the "
    "distances the draft sees stay short.",
    attrs=("max_position_embeddings", "cos_sin_cache"),
    replace=_longer_rope_table,
    per_instance=True,
)

DRAFT_KV_CACHE = Patch(
    name="Attention.kv_cache",
    target="kv_cache of each draft attention layer",
    why="Scratch blocks for compacted positions sit past the pool the scheduler "
    "manages; the layer reads its KV through this attribute (vLLM 0.26's "
    "bind_kv_cache sets it). The old tensor must be freed: not undoable.",
    attrs=("kv_cache",),
    replace=lambda layer, kv_cache: {"kv_cache": kv_cache},
    per_instance=True,
    undoable=False,
)

RUNNER_KV_CACHES = Patch(
    name="GPUModelRunner.kv_caches",
    target="GPUModelRunner.kv_caches (each runner)",
    why="The runner zeroes and copies blocks through this list; it must hold the "
    "grown draft tensors. Replaced by a copy SpecExtend updates, so the old "
    "tensors can be freed: not undoable.",
    attrs=("kv_caches",),
    replace=lambda runner: {"kv_caches": list(runner.kv_caches)},
    per_instance=True,
    undoable=False,
)

class _AfterSampling(torch.cuda.ExternalStream):
    """The runner's output copy stream itself (the same CUDA stream), whose
    ``wait_stream`` waits only for an event recorded right after this step's
    sampling, not for everything queued on the stream it is given."""

    def __new__(cls, stream, sampled: torch.cuda.Event):
        self = super().__new__(cls, stream.cuda_stream, device=stream.device)
        self.sampled = sampled
        return self

    def wait_stream(self, stream) -> None:
        self.wait_event(self.sampled)


def _copy_after_sampling(runner) -> dict:
    sample = runner._sample
    copy_stream = runner._get_or_create_async_output_copy_stream
    pending: list[torch.cuda.Event] = []

    @functools.wraps(sample)
    def sample_then_record(*args, **kwargs):
        output = sample(*args, **kwargs)
        event = torch.cuda.Event()
        event.record()
        pending[:] = [event]
        return output

    @functools.wraps(copy_stream)
    def stream_after_sampling():
        stream = copy_stream()
        event = pending.pop() if pending else None
        # Routed experts and EP fault flags are snapshotted after the drafter
        # ran: their copies must wait for the whole stream, as vLLM's do.
        if event is None or runner.routed_experts_initialized or runner.check_ep_fault:
            return stream
        return _AfterSampling(stream, event)

    return {"_sample": sample_then_record,
            "_get_or_create_async_output_copy_stream": stream_after_sampling}


EARLY_OUTPUT_COPY = Patch(
    name="GPUModelRunner._sample",
    target="GPUModelRunner._sample and _get_or_create_async_output_copy_stream "
    "(each runner, async scheduling on a GPU; SPECEXTEND_EARLY_OUTPUT_COPY=0 "
    "leaves it)",
    why="vLLM 0.26's AsyncGPUModelRunnerOutput starts the copy of the sampled "
    "tokens after everything queued on the default stream, and the drafter is "
    "queued before it: every token, the first one included, reaches the client "
    "a draft pass late. The tokens are final once sampled (nothing writes them "
    "afterwards), so the copy waits for an event recorded right after sampling.",
    attrs=("_sample", "_get_or_create_async_output_copy_stream"),
    replace=_copy_after_sampling,
    per_instance=True,
)

DRAFT_TP_GROUP = Patch(
    name="parallel_state._TP",
    target="vllm.distributed.parallel_state._TP, while a replicated draft is "
    "built and while it drafts (compat.draft_tp_group)",
    why="vLLM 0.26 sizes a layer from get_tp_group() when it is built and "
    "gathers logits over it in a forward; a one-rank group in its place builds "
    "and runs the draft whole on each rank (draft_placement: replicated), with "
    "no collective in a draft forward. Undone when the block ends.",
    attrs=("_TP",),
    replace=lambda parallel_state, group: {"_TP": group},
    per_instance=True,
)

STEP_SHAPE_SPECIALISATION = Patch(
    name="KernelParam.do_not_specialize",
    target="the parameters STEP_SHAPE_PARAMS names of vllm.v1.spec_decode.utils' "
    "eagle_prepare_next_token_padded_kernel, eagle_prepare_inputs_padded_kernel "
    "and copy_and_expand_eagle_inputs_kernel (Triton's KernelParam; on a GPU, "
    "before their first launch)",
    why="Triton compiles a kernel again for an int argument that was 1 and is "
    "not, or turns a multiple of 16, and for a pointer that was 16-byte aligned "
    "and is not. These kernels take a step's request count, its token count "
    "and inputs that a pooled or deferred prompt pass slices at any offset: "
    "each speculative server compiled them again when a second request first "
    "joined a step and as prompt passes moved, 1-3 s stalls inside its first "
    "runs on an H200 (2026-11-29; copy_and_expand 7 times in one 32K server, "
    "2026-11-30) that vLLM's JIT monitor, warning once per kernel name, left "
    "out of its log. Not specialised on them (as vLLM leaves "
    "rejection_greedy_sample_kernel's max_spec_len), each compiles once for "
    "every step of one shape of block.",
    attrs=("do_not_specialize",),
    replace=lambda param: {"do_not_specialize": True},
    per_instance=True,
)

PATCHES = (
    ENGINE_ARGS_CLI,
    ENGINE_ARGS_CONFIG,
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
)
REGISTRY = PatchRegistry(PATCHES)


# --- adapters: apply a patch when its owner exists ---------------------------------


def apply_process_patches(
    on_parser: Callable, on_config: Callable, on_args: Callable = lambda args: None
) -> None:
    """Hook vLLM's engine arguments: ``on_parser(parser)`` after each engine
    parser is built, ``on_args(engine_args)`` before and ``on_config(vllm_config)``
    after each engine config resolves. Idempotent."""
    engine_args = load("EngineArgs")
    if not REGISTRY.is_applied(ENGINE_ARGS_CLI, engine_args):
        REGISTRY.apply(ENGINE_ARGS_CLI, engine_args, on_parser)
    if not REGISTRY.is_applied(ENGINE_ARGS_CONFIG, engine_args):
        REGISTRY.apply(ENGINE_ARGS_CONFIG, engine_args, on_args, on_config)


def undo_process_patches() -> None:
    engine_args = load("EngineArgs")
    for patch in (ENGINE_ARGS_CLI, ENGINE_ARGS_CONFIG):
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
