"""``--spec-extend [JSON]`` and the ``--speculative-model`` aliases.

vLLM 0.26 has no API for plugin flags, so these are added to every parser that
``EngineArgs.add_cli_args`` builds (``vllm serve``, ``vllm bench``, offline
entry points). The flag only fills ``additional_config["spec_extend"]``; the
engine-config hook in ``plugin`` validates it and selects the worker. Bad JSON
or keys fail at parse time as a usage error.
"""

from __future__ import annotations

import argparse

from vllm_specextend.config import (
    ADDITIONAL_CONFIG_KEY,
    SpecExtendConfig,
    SpecExtendConfigError,
)

HELP = (
    "Enable SpecExtend Cross-model Retrieval for draft-model and EAGLE "
    "speculative decoding. "
    "Optional JSON with keys policy (cmr|streaming|full), chunk_size, top_k, "
    "retrieve_every, sink_tokens, recent_tokens, min_context, compact_positions "
    "(auto|true|false). "
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


def add_spec_extend_args(parser: argparse.ArgumentParser) -> None:
    if "--spec-extend" in parser._option_string_actions:
        return
    group = parser.add_argument_group("SpecExtend (vllm-specextend plugin)")
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
    additional = parser._option_string_actions.get("--additional-config")
    if additional is not None:
        additional.__class__ = _merging(type(additional))
