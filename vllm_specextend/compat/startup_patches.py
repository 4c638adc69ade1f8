"""The patches of vLLM's engine start-up: its parsers, engine arguments and config.

Each :class:`~vllm_specextend.patching.Patch` says what it patches and why:
every engine parser gets the plugin's flags, every engine config resolves
through the plugin's hooks and picks its worker and the V1 model runner, and
a config error ends ``vllm serve`` in one line. Declarations only: ``patches``
lists them with those of the running engine (``model_patches``) and applies
them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_specextend.patching import Patch

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

DRAFT_SLOTS_ATTR = "_spec_extend_draft_slots"
"""Where ``create_speculative_config`` leaves, on the ``EngineArgs`` it ran
for, how many slots a step's drafting adds per request (vLLM's
``SpeculativeConfig.max_num_new_slots_for_drafting``; 0 without speculation)."""


def _noting_draft_slots(original: Callable) -> Callable:
    @functools.wraps(original)
    def create_speculative_config(self, *args, **kwargs):
        spec = original(self, *args, **kwargs)
        slots = 0 if spec is None else spec.max_num_new_slots_for_drafting
        vars(self)[DRAFT_SLOTS_ATTR] = slots
        return spec

    return create_speculative_config


@dataclass(frozen=True)
class BatchDefaults:
    """What the plugin's step-budget hook reads once vLLM has set its batch
    defaults on an ``EngineArgs``."""

    draft_slots: int
    """Slots a step's drafting adds per request (0 without speculation)."""
    user_budget: bool
    """The user set ``max_num_batched_tokens`` or ``max_num_scheduled_tokens``."""
    max_model_len: int
    batched_dp_moe: bool
    """vLLM's default budget is a per-rank MoE dispatch size there, not a step's."""


def _then_on_defaults(original: Callable, on_defaults: Callable) -> Callable:
    """``original`` (vLLM's batch defaults), then ``on_defaults(engine_args,
    BatchDefaults)``."""

    @functools.wraps(original)
    def set_defaults(self, usage_context, model_config, parallel_config):
        user_budget = (self.max_num_batched_tokens is not None
                       or self.max_num_scheduled_tokens is not None)
        original(self, usage_context, model_config, parallel_config)
        on_defaults(self, BatchDefaults(
            draft_slots=vars(self).get(DRAFT_SLOTS_ATTR, 0),
            user_budget=user_budget,
            max_model_len=model_config.max_model_len,
            batched_dp_moe=bool(getattr(parallel_config, "use_batched_dp_moe", False)),
        ))

    return set_defaults


ENGINE_ARGS_BATCH_DEFAULTS = Patch(
    name="EngineArgs.batch_defaults",
    target="vllm.engine.arg_utils.EngineArgs.create_speculative_config and "
    "._set_default_max_num_seqs_and_batched_tokens_args",
    why="vLLM 0.26 takes a draft model's slot per request (one for each of "
    "max_num_seqs, 1,024 on an H100) out of the default step budget, so a step "
    "schedules 15,360 tokens where plain decoding schedules 16,384: a 16K prompt "
    "then needs two steps. The budget is resolved in create_engine_config, past "
    "the plugin's argument hook; these wrappers let it add the slots on top of "
    "vLLM's default instead, where the user set no budget.",
    attrs=("create_speculative_config", "_set_default_max_num_seqs_and_batched_tokens_args"),
    replace=lambda engine_args, on_defaults: {
        "create_speculative_config": _noting_draft_slots(
            engine_args.create_speculative_config),
        "_set_default_max_num_seqs_and_batched_tokens_args": _then_on_defaults(
            engine_args._set_default_max_num_seqs_and_batched_tokens_args, on_defaults),
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
