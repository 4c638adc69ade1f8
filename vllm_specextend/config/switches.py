"""Experiment switches read from the environment of the engine's workers.

A switch is not a ``spec_extend`` key: it changes how a kernel or a
heuristic runs for a benchmark (``benchmarks/realpair``) or a test, never
what a user configures. Each reader here refuses a value it cannot take by
the variable's name and what it takes, so a typo fails at the first step
instead of running the default. Pure functions; no vLLM import.
"""

from __future__ import annotations

import os


def env_choice(name: str, default: str, other: str, meanings: str = "") -> str:
    """``name``'s value, ``default`` where unset or empty; anything but the
    two values is refused. ``meanings``: what each means, for the error."""
    value = os.environ.get(name) or default
    if value not in (default, other):
        hint = meanings or f"{default!r} (the default) or {other!r}"
        raise ValueError(f"{name}={value!r}: use {hint}")
    return value


def env_flag(name: str, meaning: str) -> bool:
    """``name=1`` turns an experiment on (``meaning``, for the error), ``0``
    or unset leaves it off."""
    return env_choice(name, "0", "1", f"1 ({meaning}) or 0 (the default)") == "1"


def env_count(name: str, default: int, low: int = 0, high: int | None = None,
              unit: str = "") -> int:
    """``name``'s whole number from ``low`` (to ``high`` where given),
    ``default`` where unset or empty; ``unit`` names what it counts."""
    value = os.environ.get(name) or str(default)
    count = int(value) if value.isdigit() else -1
    if count < low or (high is not None and count > high):
        span = f"{low} to {high}" if high is not None else f"{low} or more"
        what = f"{span} {unit}".rstrip()
        raise ValueError(f"{name}={value!r}: use {what} ({default}, the default)")
    return count
