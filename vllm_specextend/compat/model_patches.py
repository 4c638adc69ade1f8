"""The patches of a running engine: the target's scoring layer, the model runner,
the draft's RoPE table and KV, its tensor-parallel group and vLLM's
spec-decode kernels.

Each :class:`~vllm_specextend.patching.Patch` says what it patches and why;
each applies to one object once it exists (``per_instance``), through the
adapters in ``patches``. Declarations only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from vllm_specextend.patching import Patch


def _capture_before_forward(impl, on_query: Callable[[torch.Tensor], None]) -> dict:
    forward = impl.forward

    @functools.wraps(forward)
    def capture(layer, query, *args, **kwargs):
        on_query(query)  # [num_tokens, num_heads * head_size], post-RoPE
        return forward(layer, query, *args, **kwargs)

    return {"forward": capture}


QUERY_CAPTURE = Patch(
    name="Attention.impl.forward",
    target="impl.forward of the target's scoring attention layer (score_layer)",
    why="Chunks are scored with that layer's post-RoPE query. vLLM 0.26's "
    "attention custom op calls layer.impl.forward(layer, query, ...); wrapping "
    "this one instance keeps Dynamo out and leaves every other layer untouched.",
    attrs=("forward",),
    replace=_capture_before_forward,
    per_instance=True,
)

LONG_DRAFTS = Patch(
    name="GPUModelRunner.effective_drafter_max_model_len",
    target="GPUModelRunner.effective_drafter_max_model_len (each runner)",
    why="vLLM 0.26's _input_fits_in_drafter zeroes the drafts once max_seq_len + "
    "K passes the draft's max_model_len; with compacted positions the draft "
    "spans a bounded working set, so it may draft up to the target's length.",
    attrs=("effective_drafter_max_model_len",),
    replace=lambda runner: {"effective_drafter_max_model_len": runner.max_model_len},
    per_instance=True,
)


def _longer_rope_table(rope, max_position: int) -> dict:
    # vLLM 0.26: _compute_cos_sin_cache sizes the table from
    # max_position_embeddings; set it only for the computation, the registry
    # writes both attributes afterwards.
    old_len, old_cache = rope.max_position_embeddings, rope.cos_sin_cache
    rope.max_position_embeddings = max_position
    try:
        # [max_position, rotary_dim]
        cache = rope._compute_cos_sin_cache().to(old_cache.device, old_cache.dtype)
    finally:
        rope.max_position_embeddings = old_len
    return {"max_position_embeddings": max_position, "cos_sin_cache": cache}


DRAFT_ROPE_TABLE = Patch(
    name="RotaryEmbedding.cos_sin_cache",
    target="max_position_embeddings and cos_sin_cache of each draft RoPE module",
    why="With compacted positions new tokens keep their real positions, so the "
    "draft's cos/sin table must cover the target's context although the "
    "distances the draft sees stay short.",
    attrs=("max_position_embeddings", "cos_sin_cache"),
    replace=_longer_rope_table,
    per_instance=True,
)

DRAFT_KV_CACHE = Patch(
    name="Attention.kv_cache",
    target="kv_cache of each draft attention layer",
    why="Scratch blocks for compacted positions sit past the pool the scheduler "
    "manages; the layer reads its KV through this attribute (vLLM 0.26's "
    "bind_kv_cache sets it). The old tensor must be freed: not undoable.",
    attrs=("kv_cache",),
    replace=lambda layer, kv_cache: {"kv_cache": kv_cache},
    per_instance=True,
    undoable=False,
)

RUNNER_KV_CACHES = Patch(
    name="GPUModelRunner.kv_caches",
    target="GPUModelRunner.kv_caches (each runner)",
    why="The runner zeroes and copies blocks through this list; it must hold the "
    "grown draft tensors. Replaced by a copy SpecExtend updates, so the old "
    "tensors can be freed: not undoable.",
    attrs=("kv_caches",),
    replace=lambda runner: {"kv_caches": list(runner.kv_caches)},
    per_instance=True,
    undoable=False,
)


class _AfterSampling(torch.cuda.ExternalStream):
    """The runner's output copy stream itself (the same CUDA stream), whose
    ``wait_stream`` waits only for an event recorded right after this step's
    sampling, not for everything queued on the stream it is given."""

    def __new__(cls, stream, sampled: torch.cuda.Event):
        self = super().__new__(cls, stream.cuda_stream, device=stream.device)
        self.sampled = sampled
        return self

    def wait_stream(self, stream) -> None:
        self.wait_event(self.sampled)


def _copy_after_sampling(runner) -> dict:
    sample = runner._sample
    copy_stream = runner._get_or_create_async_output_copy_stream
    pending: list[torch.cuda.Event] = []

    @functools.wraps(sample)
    def sample_then_record(*args, **kwargs):
        output = sample(*args, **kwargs)
        event = torch.cuda.Event()
        event.record()
        pending[:] = [event]
        return output

    @functools.wraps(copy_stream)
    def stream_after_sampling():
        stream = copy_stream()
        event = pending.pop() if pending else None
        # Routed experts and EP fault flags are snapshotted after the drafter
        # ran: their copies must wait for the whole stream, as vLLM's do.
        if event is None or runner.routed_experts_initialized or runner.check_ep_fault:
            return stream
        return _AfterSampling(stream, event)

    return {"_sample": sample_then_record,
            "_get_or_create_async_output_copy_stream": stream_after_sampling}


EARLY_OUTPUT_COPY = Patch(
    name="GPUModelRunner._sample",
    target="GPUModelRunner._sample and _get_or_create_async_output_copy_stream "
    "(each runner, async scheduling on a GPU; SPECEXTEND_EARLY_OUTPUT_COPY=0 "
    "leaves it)",
    why="vLLM 0.26's AsyncGPUModelRunnerOutput starts the copy of the sampled "
    "tokens after everything queued on the default stream, and the drafter is "
    "queued before it: every token, the first one included, reaches the client "
    "a draft pass late. The tokens are final once sampled (nothing writes them "
    "afterwards), so the copy waits for an event recorded right after sampling.",
    attrs=("_sample", "_get_or_create_async_output_copy_stream"),
    replace=_copy_after_sampling,
    per_instance=True,
)

DRAFT_TP_GROUP = Patch(
    name="parallel_state._TP",
    target="vllm.distributed.parallel_state._TP, while a replicated draft is "
    "built and while it drafts (compat.draft_tp_group)",
    why="vLLM 0.26 sizes a layer from get_tp_group() when it is built and "
    "gathers logits over it in a forward; a one-rank group in its place builds "
    "and runs the draft whole on each rank (draft_placement: replicated), with "
    "no collective in a draft forward. Undone when the block ends.",
    attrs=("_TP",),
    replace=lambda parallel_state, group: {"_TP": group},
    per_instance=True,
)

CPU_DRAFT_ATTENTION_HEADS = Patch(
    name="CPUAttentionMetadataBuilder.num_heads",
    target="num_heads of vLLM's CPU attention metadata builders of the draft's "
    "layers (each builder, CPU workers only)",
    why="vLLM 0.26's CPU builder takes its query heads from the target's model "
    "config, not the layers it builds for, and schedules the attention of a "
    "one-token query by that count: a draft with more query heads than its "
    "target (the real pair: 14 against 12) computes its second to K-th drafts "
    "from heads never attended, and every one of them is rejected (the real "
    "pair on this CPU: accepted per position 32, 0, 0, 0 of 32; 13 of 13 at "
    "every position with the heads set, 2026-12-07). The same class of bug as "
    "vLLM's FlashAttention builder (vllm-project/vllm#39775).",
    attrs=("num_heads",),
    replace=lambda builder, heads: {"num_heads": heads},
    per_instance=True,
)

STEP_SHAPE_SPECIALISATION = Patch(
    name="KernelParam.do_not_specialize",
    target="the parameters STEP_SHAPE_PARAMS names of vllm.v1.spec_decode.utils' "
    "eagle_prepare_next_token_padded_kernel, eagle_prepare_inputs_padded_kernel "
    "and copy_and_expand_eagle_inputs_kernel (Triton's KernelParam; on a GPU, "
    "before their first launch)",
    why="Triton compiles a kernel again for an int argument that was 1 and is "
    "not, or turns a multiple of 16, and for a pointer that was 16-byte aligned "
    "and is not. These kernels take a step's request count, its token count "
    "and inputs that a pooled or deferred prompt pass slices at any offset: "
    "each speculative server compiled them again when a second request first "
    "joined a step and as prompt passes moved, 1-3 s stalls inside its first "
    "runs on an H200 (2026-11-29; copy_and_expand 7 times in one 32K server, "
    "2026-11-30) that vLLM's JIT monitor, warning once per kernel name, left "
    "out of its log. Not specialised on them (as vLLM leaves "
    "rejection_greedy_sample_kernel's max_spec_len), each compiles once for "
    "every step of one shape of block.",
    attrs=("do_not_specialize",),
    replace=lambda param: {"do_not_specialize": True},
    per_instance=True,
)
