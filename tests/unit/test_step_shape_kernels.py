"""vLLM's spec-decode kernels compile once for every step shape: request and
token counts, inputs sliced at any offset
(``compat.patches.STEP_SHAPE_SPECIALISATION``)."""

from __future__ import annotations

import types

import pytest
import torch

from vllm_specextend import compat
from vllm_specextend.compat import patches

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@pytest.fixture(autouse=True)
def undo_new_patches():
    before = compat.REGISTRY.applied()
    yield
    compat.REGISTRY.undo_since(before)


@triton.jit
def _next_token_kernel(x_ptr, num_reqs, BLOCK: tl.constexpr):
    pass


@triton.jit
def _inputs_kernel(x_ptr, num_reqs, BLOCK: tl.constexpr):
    pass


@triton.jit
def _copy_kernel(target_token_ids_ptr, target_positions_ptr, next_token_ids_ptr,
                 out_input_ids_ptr, query_start_loc_ptr, query_end_loc_ptr,
                 total_input_tokens, BLOCK_SIZE_TOKENS: tl.constexpr):
    pass


STAND_INS = dict(zip(patches.STEP_SHAPE_PARAMS,
                     (_next_token_kernel, _inputs_kernel, _copy_kernel), strict=True))


def _binder(kernel):
    """What Triton keys a launch's compile on, as the binder a first launch
    builds (no GPU needed)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    bind = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    return lambda *args, **kwargs: str(bind(*args, **kwargs)[1])


def _count_keys(kernel, n: int) -> str:
    return _binder(kernel)(torch.zeros(4, dtype=torch.int32), n, BLOCK=8)


def _copy_keys(offset: int, tokens: int, block: int = 8) -> str:
    """A step's copy: its inputs ``offset`` int32s into a buffer (a pooled
    prompt pass slices them so), ``tokens`` of them."""
    buf = torch.zeros(64, dtype=torch.int32)
    pos = torch.zeros(64, dtype=torch.int64)
    out = torch.zeros(64, dtype=torch.int32)
    return _binder(_copy_kernel)(buf[offset:], pos[offset:], buf[offset:], out,
                                 buf[offset:], buf[offset:], tokens,
                                 BLOCK_SIZE_TOKENS=block)


def test_spec_decode_kernels_compile_once_for_every_step_shape(monkeypatch):
    # vLLM's eagle_prepare_*_padded kernels take a step's request count as an
    # int, and its copy of a step's inputs the token count and inputs a
    # prompt pass slices at any offset: Triton compiles for 1, for a multiple
    # of 16 and any other count, for 16-byte aligned and other pointers, and a
    # server stalled each first time (2026-11-29 and 30). Kernels of those
    # signatures stand in for them (vLLM's CPU platform turns Triton off):
    # once patched, one compile serves every shape of a block.
    module = types.SimpleNamespace(**STAND_INS)
    counts = (1, 2, 16, 48)
    shapes = [(offset, tokens) for offset in (0, 1, 4) for tokens in counts]
    assert len({_count_keys(_inputs_kernel, n) for n in counts}) == 3
    assert len({_copy_keys(*s) for s in shapes}) == 6  # aligned or not, x3 counts
    assert compat.compile_once_per_step_shape(module) == 3
    assert compat.compile_once_per_step_shape(module) == 3  # applied once
    for kernel in (_next_token_kernel, _inputs_kernel):
        assert len({_count_keys(kernel, n) for n in counts}) == 1
    assert len({_copy_keys(*s) for s in shapes}) == 1
    assert _copy_keys(0, 5, block=256) != _copy_keys(0, 5)  # a block of its own
    (param,) = [p for p in _inputs_kernel.params if p.name == "num_reqs"]
    compat.REGISTRY.undo(patches.STEP_SHAPE_SPECIALISATION, param)
    assert len({_count_keys(_inputs_kernel, n) for n in counts}) == 3
    # A kernel launched already (its binder built) keeps its keys; a plain
    # function (Triton off) has none.
    names = list(STAND_INS)
    launched = types.SimpleNamespace(params=_inputs_kernel.params,
                                     device_caches={0: "binder"})
    plain = types.SimpleNamespace(**dict.fromkeys(names, lambda *args: None))
    assert compat.compile_once_per_step_shape(plain) == 0
    plain_and_launched = types.SimpleNamespace(
        **{**dict.fromkeys(names, lambda *args: None), names[0]: launched})
    warned = []
    monkeypatch.setattr(patches.logger, "warning",
                        lambda msg, *args: warned.append(msg % args))
    assert compat.compile_once_per_step_shape(plain_and_launched) == 0
    assert len(warned) == 1 and names[0] in warned[0], warned
    # A kernel without the parameter: vLLM changed; the message says which.
    renamed = types.SimpleNamespace(**dict.fromkeys(names, types.SimpleNamespace(
        params=[types.SimpleNamespace(name="batch_size")], device_caches={})))
    with pytest.raises(RuntimeError, match="no parameter num_reqs"):
        compat.compile_once_per_step_shape(renamed)
    # vLLM 0.26 names the three kernels (on this CPU platform as plain
    # functions or not yet launched).
    from vllm.v1.spec_decode import utils

    kernels = [getattr(utils, name) for name in names]
    unlaunched = [hasattr(k, "params") and not k.device_caches for k in kernels]
    assert compat.compile_once_per_step_shape() == sum(unlaunched)


def _runner(max_reqs: int = 64):
    """The runner buffers vLLM's batch-change correction reads
    (``GPUModelRunner._prepare_inputs``), on CPU."""
    def buffer(dtype):
        return types.SimpleNamespace(gpu=torch.zeros(max_reqs, dtype=dtype))
    return types.SimpleNamespace(
        use_async_spec_decode=True,
        num_computed_tokens=torch.zeros(max_reqs, dtype=torch.int32),
        prev_positions=buffer(torch.int64), num_accepted_tokens=buffer(torch.int32),
        prev_num_draft_tokens=buffer(torch.int32),
        input_batch=types.SimpleNamespace(
            num_computed_tokens_cpu_tensor=torch.arange(max_reqs, dtype=torch.int32)))


def _batch_change_step(fn, runner, num_reqs: int, prev_reqs: int) -> None:
    """The correction as ``_prepare_inputs`` calls it in a step: the runner's
    buffers (made outside inference mode) sliced, the step's fresh tensors,
    inside ``torch.inference_mode`` as ``execute_model`` runs."""
    with torch.inference_mode():
        fn(runner.num_computed_tokens, runner.num_accepted_tokens.gpu[:num_reqs],
           runner.prev_positions.gpu[:num_reqs],
           torch.ones(prev_reqs, dtype=torch.int32),  # the step before's counts
           runner.prev_num_draft_tokens.gpu,
           runner.input_batch.num_computed_tokens_cpu_tensor[:num_reqs].to("cpu"))


def _own_copy(fn):
    """``fn`` with a code object of its own: Dynamo keeps compiled graphs on
    the code object, so a copy starts with none (no global reset)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                              fn.__defaults__, fn.__closure__)


def test_the_batch_change_correction_compiles_at_warm_up_for_every_step():
    # vLLM compiles its async correction of computed-token counts with
    # torch.compile(dynamic=True), which specialises sizes of 1: a server
    # compiled it again inside its first step with two requests. Dynamo's
    # guards are the same with any backend: a counting one stands in for
    # inductor here. Steps run in inference mode: a warm-up outside it would
    # compile graphs no step reuses.
    from torch._dynamo.testing import CompileCounter
    from vllm.v1.spec_decode import utils

    correction = utils.update_num_computed_tokens_for_batch_change
    original = correction._torchdynamo_orig_callable
    counter = CompileCounter()
    fn = torch.compile(_own_copy(original), dynamic=True, backend=counter)
    runner = _runner()
    state = [runner.num_computed_tokens, runner.num_accepted_tokens.gpu,
             runner.prev_positions.gpu, runner.prev_num_draft_tokens.gpu]
    before = [t.clone() for t in state]
    assert compat.warm_up_batch_change(runner, fn) == len(
        compat.warmup.BATCH_CHANGE_SIZES) == counter.frame_count == 4
    assert all(torch.equal(a, b) for a, b in zip(state, before))  # copies
    for num_reqs, prev_reqs in [(1, 1), (2, 1), (3, 2), (16, 1), (1, 16),
                                (17, 33), (48, 47), (2, 2), (64, 64)]:
        _batch_change_step(fn, runner, num_reqs, prev_reqs)
    assert counter.frame_count == 4
    # Without the warm-up: a second compile when two requests first meet.
    cold = CompileCounter()
    fn = torch.compile(_own_copy(original), dynamic=True, backend=cold)
    _batch_change_step(fn, runner, 1, 1)
    _batch_change_step(fn, runner, 2, 1)
    assert cold.frame_count == 2
    # Synchronous scheduling (vLLM's CPU platform) never runs it.
    runner.use_async_spec_decode = False
    assert compat.warm_up_batch_change(runner, fn) == 0
