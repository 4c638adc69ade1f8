"""Async scheduling on by default under --spec-extend, and only there."""

from __future__ import annotations

import types

import pytest

from vllm_specextend import scheduling


def _args(spec_extend=True, async_scheduling=None, backend=None):
    extra = {"spec_extend": {}} if spec_extend else {}
    return types.SimpleNamespace(additional_config=extra,
                                 async_scheduling=async_scheduling,
                                 distributed_executor_backend=backend)


@pytest.fixture
def gpu_platform(monkeypatch):
    monkeypatch.setattr(scheduling.compat, "is_cpu_platform", lambda: False)


@pytest.mark.usefixtures("gpu_platform")
@pytest.mark.parametrize("backend", [None, "mp", "uni"])
def test_spec_extend_turns_async_scheduling_on(backend):
    args = _args(backend=backend)
    assert scheduling.async_by_default(args)
    assert args.async_scheduling is True


@pytest.mark.usefixtures("gpu_platform")
@pytest.mark.parametrize("args", [
    _args(async_scheduling=False),  # --no-async-scheduling stands
    _args(spec_extend=False),  # not our engine
    _args(backend="ray"),  # Ray's executor has no async scheduling
], ids=["user-off", "no-plugin", "ray"])
def test_left_alone(args):
    before = args.async_scheduling
    assert not scheduling.async_by_default(args)
    assert args.async_scheduling is before


def test_cpu_platform_is_left_to_vllm(monkeypatch):
    monkeypatch.setattr(scheduling.compat, "is_cpu_platform", lambda: True)
    args = _args()
    assert not scheduling.async_by_default(args)
    assert args.async_scheduling is None
