"""Async scheduling on by default under --spec-extend, and only there; a
step's token budget as without speculation where the user set none."""

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


# --- the step budget ------------------------------------------------------------------


def _budget_args(spec_extend=True, batched=16384, seqs=1024):
    """``EngineArgs`` as vLLM's batch defaults leave them."""
    extra = {"spec_extend": {}} if spec_extend else {}
    return types.SimpleNamespace(additional_config=extra, max_num_batched_tokens=batched,
                                 max_num_scheduled_tokens=None, max_num_seqs=seqs)


def _defaults(slots=1, user_budget=False, max_model_len=32768, batched_dp_moe=False):
    return scheduling.compat.BatchDefaults(slots, user_budget, max_model_len, batched_dp_moe)


def test_the_draft_slots_go_on_top_of_the_default_budget():
    args = _budget_args()
    assert scheduling.plain_step_budget(args, _defaults())
    assert args.max_num_scheduled_tokens == 16384, "a step as without speculation"
    assert args.max_num_batched_tokens == 16384 + 1024


@pytest.mark.parametrize("args, defaults", [
    # --max-num-batched-tokens (or the scheduled one) stands
    (_budget_args(), _defaults(user_budget=True)),
    (_budget_args(), _defaults(slots=0)),  # EAGLE: no slot, vLLM takes nothing off
    (_budget_args(spec_extend=False), _defaults()),  # vLLM's draft_model alone
    # vLLM capped its default at max_num_seqs * max_model_len: every sequence
    # fits whole, and a budget past the cap makes vLLM warn at start.
    (_budget_args(batched=8192, seqs=1), _defaults(max_model_len=8192)),
    (_budget_args(batched=256, seqs=256), _defaults(batched_dp_moe=True)),
], ids=["user-budget", "no-slots", "no-plugin", "capped", "batched-dp-moe"])
def test_budget_left_alone(args, defaults):
    before = args.max_num_batched_tokens
    assert not scheduling.plain_step_budget(args, defaults)
    assert (args.max_num_batched_tokens, args.max_num_scheduled_tokens) == (before, None)


def _scheduler_config(model, draft=None, spec_extend=True, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    from vllm_specextend import plugin

    plugin.register()
    spec = None if draft is None else {"method": "draft_model", "model": draft,
                                       "num_speculative_tokens": 4}
    extra = {"spec_extend": {}} if spec_extend and draft else {}
    args = EngineArgs(model=model, speculative_config=spec, additional_config=extra,
                      max_model_len=2048, block_size=32, **kwargs)
    return args.create_engine_config().scheduler_config


def test_an_engine_schedules_plain_decodings_budget(tiny_target, tiny_draft):
    """Through vLLM's own config resolution: with the plugin a step schedules
    what plain decoding's does; vLLM's ``draft_model`` alone takes a slot per
    sequence off it, and a budget the user gives keeps vLLM's rule."""
    plain = _scheduler_config(tiny_target)
    ours = _scheduler_config(tiny_target, tiny_draft)
    theirs = _scheduler_config(tiny_target, tiny_draft, spec_extend=False)
    assert ours.max_num_scheduled_tokens == plain.max_num_batched_tokens
    assert ours.max_num_batched_tokens == plain.max_num_batched_tokens + ours.max_num_seqs
    assert theirs.max_num_scheduled_tokens == (plain.max_num_batched_tokens
                                               - theirs.max_num_seqs)
    given = _scheduler_config(tiny_target, tiny_draft, max_num_batched_tokens=4096)
    assert given.max_num_batched_tokens == 4096
    assert given.max_num_scheduled_tokens == 4096 - given.max_num_seqs
    # One sequence: vLLM caps its default at max_model_len, and so it stays.
    one = _scheduler_config(tiny_target, tiny_draft, max_num_seqs=1)
    assert (one.max_num_batched_tokens, one.max_num_scheduled_tokens) == (2048, 2047)
