"""GPU: draft passes over prompt chunks kept for a later step (``deferral.py``)
draft what they draft in their own step, under CUDA graphs and async
scheduling (vLLM's defaults, as served).

A token budget of 1,024, at most 256 prompt tokens per request and step,
splits the prompts into chunks that run side by side, so the first steps
sample nothing and keep passes of several rows. With deferral on and off, every
proposal must be equal, token for token, and the greedy outputs must equal
vLLM's own speculation with the same draft, K and budget (no plugin).
``tests/engine/test_prefill_deferral.py`` covers prefix caching, an aborted
request and a control on the CPU.

Under vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``: no split-K
GEMMs, one FlashAttention split): a kept pass runs over fewer rows than its
step, and without it a GPU's kernels need not round a row the same way in a
smaller batch. On an H200 (2026-11-28) the 3,000-token request's proposals
differed with deferral on and off while the outputs' verification was not
reached; exact equality is the claim, so the kernels must not vary with the
batch (``tests/engine`` keeps fp32 on the CPU for the same reason). The mode
holds for the whole process once on (torch reads cuBLAS's workspace setting
at its first use, and vLLM's overrides of torch's ops stay): run this file in
a pytest process of its own, as ``host_run.sh graph-tests`` does.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from vllm_specextend import compat

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from test_draft_graph_gpu import CMR, _generate, models  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _batch_invariant():
    """Engines started here run vLLM's batch-invariant mode; the environment
    (the mode's own writes too) is put back after, and vLLM reads it afresh."""
    if torch.cuda.is_initialized() and not compat.batch_invariant_on():
        pytest.fail("CUDA was used in this process before vLLM's batch-invariant "
                    "mode: run this file in a pytest process of its own")
    saved = dict(os.environ)
    os.environ["VLLM_BATCH_INVARIANT"] = "1"
    compat.reread_env()
    yield
    os.environ.clear()
    os.environ.update(saved)
    compat.reread_env()


CHUNKED = dict(max_num_batched_tokens=1024, long_prefill_token_threshold=256,
               max_num_seqs=8)


@pytest.mark.parametrize("window, lengths", [
    # The last row's prompt ends first: the others' chunks lead its steps.
    (None, (3000, 2000, 1200)),
    # The first row's ends first: the others' chunks trail.
    (512, (1200, 2000, 3000)),
])
def test_kept_passes_draft_as_in_their_step(models, window, lengths):  # noqa: F811
    """With ``draft_prefill_window`` too: FlashAttention reads each prompt
    chunk through its window (in its step or kept), and the outputs stay
    vLLM's speculation's. The prompts prefill side by side and the shortest
    ends first, so its first drafting steps are cut (``kept_passes.Cut``), the
    prompt chunks before it or after it in the batch (the persistent batch
    keeps each request's row). The CPU engine test's steps have their chunks
    last only: there the unit tests check the other cut."""
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 500) for _ in range(n)] for n in lengths]
    target = models["target"]
    # The draft's full pass, named: deferral keeps prompt-chunk passes that a
    # pooled prompt drops ("auto" steps aside here anyway: 1,024 tokens a step).
    spec = {**CMR, "draft_prefill_window": window, "draft_prompt_pool": None}
    reference = _generate(target, "draft_model", target, prompts, **CHUNKED)
    assert compat.batch_invariant_on()
    off = _generate(target, "draft_model", target, prompts,
                    {**spec, "defer_prefill_draft": False}, **CHUNKED)
    on = _generate(target, "draft_model", target, prompts, spec, **CHUNKED)

    assert on["captured"] and on["async"]
    assert off["stats"]["deferred_prefill_passes"] == 0
    assert off["stats"]["split_prefill_steps"] == 0
    assert on["stats"]["deferred_prefill_passes"] > 0, "steps kept their pass"
    # The 1,200-token prompt decodes while the others still prefill.
    assert on["stats"]["split_prefill_steps"] > 0, "steps kept their chunks' pass"
    assert on["stats"]["graph_steps"] > 0
    assert (on["stats"]["prefill_window_rows"] > 0) == (window is not None)
    assert on["proposals"] == off["proposals"], (
        "kept passes drafted otherwise: "
        + _differences(on["proposals"], off["proposals"]))
    assert on["outputs"] == off["outputs"] == reference["outputs"]


def _differences(on: list, off: list) -> str:
    """Per request: how many of its proposals differ and the first that does."""
    out = []
    for i, (a, b) in enumerate(zip(on, off, strict=False)):
        diff = [j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
        out.append(f"request {i}: {len(diff)} of {len(a)}/{len(b)} differ"
                   + (f", first at {diff[0]}" if diff else ""))
    return "; ".join(out)
