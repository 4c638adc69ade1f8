"""Reads of vLLM's CLI parsers (``FlexibleArgumentParser``, an argparse parser).

argparse has no public lookup of an action by its option string; the parser's
``_option_string_actions`` is that lookup, read here only.
"""

from __future__ import annotations

import argparse


def option_action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    """The action that handles ``flag`` (e.g. ``"--additional-config"``), if any."""
    return parser._option_string_actions.get(flag)


def has_option(parser: argparse.ArgumentParser, flag: str) -> bool:
    return option_action(parser, flag) is not None
