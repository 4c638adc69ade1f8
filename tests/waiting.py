"""Waiting for a state, not for a time (docs/testing.md, "Timing"): the tests'
one poll loop, with a timeout that only a hang runs out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

WAIT_S = 120.0
"""Bounds a wait. The states waited for come in seconds, on 2 loaded cores
too."""


def wait_for(probe: Callable[[], T], done: Callable[[T], bool], what: str,
             timeout_s: float = WAIT_S) -> T:
    """``probe()`` until ``done`` holds for its value; returns that value. Fails
    the test, with ``what`` and the last value, once ``timeout_s`` is over."""
    deadline = time.monotonic() + timeout_s
    while not done(value := probe()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:.0f} s; "
                        f"last: {str(value)[-3000:]}")
        time.sleep(0.1)
    return value
