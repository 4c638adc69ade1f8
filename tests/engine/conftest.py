"""Fixtures of the engine tests whose module names its ``LENGTHS`` and ``MAX_TOKENS``."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def prompts(request, long_prompts):
    return long_prompts(request.module.LENGTHS)


@pytest.fixture(scope="module")
def plain_outputs(request, tiny_target, prompts):
    from cpu_engine import plain_reference

    return plain_reference(tiny_target, prompts, request.module.MAX_TOKENS)
