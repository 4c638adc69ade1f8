"""``--spec-extend [JSON]``, the ``--speculative-model`` aliases, brief errors.

vLLM 0.26 has no API for plugin flags, so these are added to every parser that
``EngineArgs.add_cli_args`` builds (``vllm serve``, ``vllm bench``, offline
entry points), in a help group ``SpecExtend`` (``--help=SpecExtend``). The
flag only fills ``additional_config["spec_extend"]``; the engine-config hook
in ``plugin`` validates it and selects the worker. Bad JSON or keys fail at
parse time as a usage error; a config the resolved engine cannot serve fails
when the engine config resolves, and :func:`report_config_errors_briefly`
makes that a one-line error too.

The parsers that have ``--middleware`` (``vllm serve``'s: vLLM adds its
frontend flags before the engine's) also check the API key when the plugin's
middleware is named (``auth``): it fails closed at parse time, where an error
stops the server.
"""

from __future__ import annotations

import argparse
import os
import sys

from vllm_specextend import compat
from vllm_specextend.config import (
    ADDITIONAL_CONFIG_KEY,
    SpecExtendConfig,
    SpecExtendConfigError,
)

GROUP = "SpecExtend"
# What `--middleware` names for auth.ApiKeyMiddleware (a string: importing auth
# loads vLLM's API-server module; tests/unit/test_auth.py checks it resolves).
MIDDLEWARE = "vllm_specextend.auth.ApiKeyMiddleware"
# The same class by the module it lives in (serving.auth): checked alike.
MIDDLEWARE_NAMES = (MIDDLEWARE, "vllm_specextend.serving.auth.ApiKeyMiddleware")
# vLLM's plain --help lists each group's title and description on one line.
GROUP_DESCRIPTION = (
    "Cross-model Retrieval for long-input speculative decoding (vllm-specextend "
    "plugin): --spec-extend [JSON], --speculative-model DRAFT, "
    "--num-speculative-tokens K."
)
HELP = (
    "Enable SpecExtend Cross-model Retrieval for draft-model and EAGLE "
    "speculative decoding. "
    "Optional JSON with keys policy (cmr|streaming|full), chunk_size, top_k, "
    "retrieve_every, score_layer (-1: the final attention layer), sink_tokens, "
    "recent_tokens, min_context, compact_positions (auto|true|false), "
    "self_draft (true|false), draft_graph (auto|off|static), "
    "defer_prefill_draft (true|false), draft_vocab (greedy drafts from the "
    "first N token ids; null: all), draft_prefill_window (the draft's prompt "
    "passes attend to the sinks and the N tokens before each piece of 1,024; "
    "auto: 4096 where the engine can and no pool bounds the pass; null: "
    "all), draft_prompt_pool (the draft's KV of a long prompt only for its "
    "sinks, the N chunks ranked top at its end and its window; auto: 2 x "
    "top_k where the engine can pool; null: all), draft_pool_fill (chunks "
    "each refresh adds to a pooled prompt's draft KV; auto: 8 with a pool; "
    "null: none), draft_placement "
    "(auto|sharded|replicated: a draft model whole on every tensor-parallel "
    "rank), lookup_tokens (the last N of a step's K tokens looked up in the "
    "request's own context instead of drafted; auto: K - 3 from K=8 with a "
    "draft model; 0: off), carry_drafts (steps after one whose lookups held "
    "draft only N tokens and look up the rest; null: off). "
    "Example: --spec-extend '{\"top_k\": 64, \"retrieve_every\": 4}'."
)


def _merge(namespace: argparse.Namespace, update: dict) -> None:
    current = getattr(namespace, "additional_config", None) or {}
    namespace.additional_config = {**current, **update}


class SpecExtendAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        try:
            cfg = SpecExtendConfig.from_json(values)
        except SpecExtendConfigError as e:
            raise argparse.ArgumentError(self, str(e)) from e
        _merge(namespace, {ADDITIONAL_CONFIG_KEY: cfg.to_dict()})


def _merging(action_cls: type) -> type:
    """``--additional-config`` that keeps keys set earlier by ``--spec-extend``."""

    class MergingAction(action_cls):
        def __call__(self, parser, namespace, values, option_string=None):
            if isinstance(values, dict):
                _merge(namespace, values)
            else:
                super().__call__(parser, namespace, values, option_string)

    return MergingAction


def _checking_key(action_cls: type) -> type:
    """``--middleware`` that refuses the plugin's middleware without a key."""

    class KeyCheckingAction(action_cls):
        def __call__(self, parser, namespace, values, option_string=None):
            if values in MIDDLEWARE_NAMES:
                # Imported here: it loads vLLM's API-server module, which a
                # parser without this middleware has no need for.
                from vllm_specextend.serving.auth import KEY_ENV, check_key

                try:
                    check_key(os.environ.get(KEY_ENV))
                except ValueError as e:
                    raise argparse.ArgumentError(self, str(e)) from e
            super().__call__(parser, namespace, values, option_string)

    return KeyCheckingAction


def add_spec_extend_args(parser: argparse.ArgumentParser) -> None:
    if compat.has_option(parser, "--spec-extend"):
        return
    group = parser.add_argument_group(GROUP, GROUP_DESCRIPTION)
    group.add_argument(
        "--spec-extend",
        nargs="?",
        const="{}",
        default=None,
        metavar="JSON",
        action=SpecExtendAction,
        help=HELP,
    )
    group.add_argument(
        "--speculative-model",
        dest="spec_model",
        metavar="DRAFT",
        help="Alias of --spec-model: the draft model for speculative decoding.",
    )
    group.add_argument(
        "--num-speculative-tokens",
        dest="spec_tokens",
        type=int,
        metavar="K",
        help="Alias of --spec-tokens: draft tokens per step.",
    )
    compat.wrap_option_action(parser, "--additional-config", _merging)
    compat.wrap_option_action(parser, "--middleware", _checking_key)


def config_error(exc: BaseException | None) -> SpecExtendConfigError | None:
    """The SpecExtendConfigError ``exc`` is or was raised from, if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, SpecExtendConfigError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _brief(previous):
    """An excepthook printing an uncaught SpecExtendConfigError as one line."""

    def excepthook(exc_type, exc, tb):
        error = config_error(exc)
        if error is None:
            return previous(exc_type, exc, tb)
        sys.stderr.write(f"{_prog()}: error: {error}\n")
        sys.stderr.flush()

    return excepthook


def _prog() -> str:
    """``vllm`` for the console script, as argparse names a program."""
    argv0 = sys.argv[0] if sys.argv else ""
    return "python" if argv0 in ("", "-c") else os.path.basename(argv0)


def report_config_errors_briefly() -> None:
    """Once per process: an uncaught SpecExtendConfigError (e.g. from the
    engine-config hook under ``vllm serve``) ends the process with its message
    on one line and exit status 1, not a traceback. Code that calls vLLM
    itself (``LLM(...)``) still gets the exception to catch."""
    compat.report_errors_briefly(_brief)
