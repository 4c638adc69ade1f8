"""vLLM's spec-decode kernels that take a step's request count compile once
for every count (``compat.patches.BATCH_COUNT_SPECIALISATION``)."""

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
    for patch, owner in reversed(compat.REGISTRY.applied()):
        if not any(p is patch and o is owner for p, o in before):
            compat.REGISTRY.undo(patch, owner)


@triton.jit
def _next_token_kernel(x_ptr, num_reqs, BLOCK: tl.constexpr):
    pass


@triton.jit
def _inputs_kernel(x_ptr, num_reqs, BLOCK: tl.constexpr):
    pass


def _launch_key(kernel, num_reqs: int):
    """What Triton keys a launch's compile on, from the binder a first launch
    builds (no GPU needed)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    bind = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    return bind(torch.zeros(4, dtype=torch.int32), num_reqs, BLOCK=8)[1]


def test_spec_decode_kernels_compile_once_for_every_request_count(monkeypatch):
    # vLLM's eagle_prepare_*_padded kernels take a step's request count as an
    # int: Triton compiles them for 1, for a multiple of 16 and for any other
    # count, and a server stalled the first time its batch reached each
    # (2026-11-29). Kernels of that signature stand in for them (vLLM's CPU
    # platform turns Triton off): once patched, one compile serves every count.
    names = list(patches.BATCH_COUNT_KERNELS)
    module = types.SimpleNamespace(**dict(zip(names, (_next_token_kernel,
                                                      _inputs_kernel), strict=True)))
    counts = (1, 2, 16, 48)
    assert len({str(_launch_key(_inputs_kernel, n)) for n in counts}) == 3
    assert compat.compile_once_per_batch_count(module) == 2
    assert compat.compile_once_per_batch_count(module) == 2  # applied once
    for kernel in (_next_token_kernel, _inputs_kernel):
        assert len({str(_launch_key(kernel, n)) for n in counts}) == 1
    (param,) = [p for p in _inputs_kernel.params if p.name == "num_reqs"]
    compat.REGISTRY.undo(patches.BATCH_COUNT_SPECIALISATION, param)
    assert len({str(_launch_key(_inputs_kernel, n)) for n in counts}) == 3
    # A kernel launched already (its binder built) keeps its keys; a plain
    # function (Triton off) has none.
    launched = types.SimpleNamespace(params=_inputs_kernel.params,
                                     device_caches={0: "binder"})
    plain = types.SimpleNamespace(**dict.fromkeys(names, lambda *args: None))
    assert compat.compile_once_per_batch_count(plain) == 0
    plain_and_launched = types.SimpleNamespace(**{names[0]: launched,
                                                  names[1]: lambda *args: None})
    warned = []
    monkeypatch.setattr(patches.logger, "warning",
                        lambda msg, *args: warned.append(msg % args))
    assert compat.compile_once_per_batch_count(plain_and_launched) == 0
    assert len(warned) == 1 and names[0] in warned[0], warned
    # A kernel without the parameter: vLLM changed; the message says which.
    renamed = types.SimpleNamespace(**dict.fromkeys(names, types.SimpleNamespace(
        params=[types.SimpleNamespace(name="batch_size")], device_caches={})))
    with pytest.raises(RuntimeError, match="no parameter num_reqs"):
        compat.compile_once_per_batch_count(renamed)
    # vLLM 0.26 names both kernels (on this CPU platform as plain functions).
    from vllm.v1.spec_decode import utils

    kernels = [getattr(utils, name) for name in names]
    unlaunched = [hasattr(k, "params") and not k.device_caches for k in kernels]
    assert compat.compile_once_per_batch_count() == sum(unlaunched)
