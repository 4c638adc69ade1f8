"""Async scheduling on by default under --spec-extend, and only there."""

from __future__ import annotations

import types

import pytest

from vllm_specextend.serving import scheduling


def _args(spec_extend=True, async_scheduling=None, backend=None):
    extra = {"spec_extend": {}} if spec_extend else {}
    return types.SimpleNamespace(additional_config=extra,
                                 async_scheduling=async_scheduling,
                                 distributed_executor_backend=backend)


@pytest.fixture
def gpu_platform(monkeypatch):
    monkeypatch.setattr(scheduling.compat, "is_cpu_platform", lambda: False)


@pytest.fixture
def ray_v2(monkeypatch):
    """vLLM 0.26's default Ray executor: the v2 one (multiprocessing)."""
    monkeypatch.setenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "1")
    scheduling.compat.reread_env()


@pytest.mark.usefixtures("gpu_platform", "ray_v2")
@pytest.mark.parametrize("backend", [None, "mp", "uni", "ray"])
def test_spec_extend_turns_async_scheduling_on(backend):
    args = _args(backend=backend)
    assert scheduling.async_by_default(args)
    assert args.async_scheduling is True


@pytest.mark.usefixtures("gpu_platform")
@pytest.mark.parametrize("v2", ["1", "0"])
def test_ray_follows_the_executor_vllm_picks(monkeypatch, v2):
    """What the plugin asks for under Ray is what vLLM's executor class for
    Ray supports (v2: yes; the v1 compiled-DAG executor: no)."""
    from vllm.v1.executor.abstract import Executor

    monkeypatch.setenv("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", v2)
    scheduling.compat.reread_env()
    config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(
        distributed_executor_backend="ray"))
    executor = Executor.get_class(config)
    assert executor.__name__ == ("RayExecutorV2" if v2 == "1" else "RayDistributedExecutor")
    args = _args(backend="ray")
    assert scheduling.async_by_default(args) is executor.supports_async_scheduling()
    # An executor class given as the backend answers for itself.
    args = _args(backend=executor)
    assert scheduling.async_by_default(args) is executor.supports_async_scheduling()


@pytest.mark.usefixtures("gpu_platform")
@pytest.mark.parametrize("args", [
    _args(async_scheduling=False),  # --no-async-scheduling stands
    _args(spec_extend=False),  # not our engine
    _args(backend="external"),  # an executor vLLM would refuse it for
], ids=["user-off", "no-plugin", "other-executor"])
def test_left_alone(args):
    before = args.async_scheduling
    assert not scheduling.async_by_default(args)
    assert args.async_scheduling is before


def test_cpu_platform_is_left_to_vllm(monkeypatch):
    monkeypatch.setattr(scheduling.compat, "is_cpu_platform", lambda: True)
    args = _args()
    assert not scheduling.async_by_default(args)
    assert args.async_scheduling is None
