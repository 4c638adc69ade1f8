"""What SpecExtend adds to vLLM's workers; ``gpu`` and ``cpu`` apply it.

vLLM 0.26 builds the model runner, and with it a plain DraftModelProposer or
EagleProposer, inside ``init_device``; the runner only type-checks its drafter
with ``isinstance``, so swapping in our subclass of the same class before
``load_model`` is enough.
With compacted positions the worker also takes the draft's scratch KV blocks,
added after vLLM allocates its KV cache, out of the memory vLLM sizes that
cache from, so both fit ``--gpu-memory-utilization`` / ``kv_cache_memory_bytes``.
The worker also forwards finished and preempted request ids, so per-request
state is freed when the scheduler lets go of a request, not when it is next
missing from a batch.
"""

from __future__ import annotations

from typing_extensions import override

from vllm_specextend import compat
from vllm_specextend.config import SpecExtendConfigError
from vllm_specextend.serving.settings import Settings

logger = compat.logger


class SpecExtendWorkerMixin:
    """Goes in front of a vLLM worker class (``GPUWorker``, ``CPUWorker``)."""

    settings: Settings

    @override
    def init_device(self):
        super().init_device()
        compat.check_touch_points()
        # Authoritative: also covers engine configs built without the
        # engine-config hook; the proposer gets the same Settings.
        self.settings = Settings.from_vllm(self.vllm_config)
        from vllm_specextend.proposer import proposer_class

        runner = self.model_runner
        _raise_if_not_v1_runner(runner)
        proposer = proposer_class(self.settings.config, self.settings.facts.method)
        runner.drafter = proposer(self.vllm_config, runner.device, runner=runner)

    @override
    def determine_available_memory(self) -> int:
        # Profiled, or kv_cache_memory_bytes as given: vLLM fills all of it with
        # its pool, so the scratch blocks added after it must come out of it.
        available = super().determine_available_memory()
        scratch = self.model_runner.drafter.scratch_bytes()
        if not scratch:
            return available
        # vLLM's own check that one request fits what is left names only its
        # knobs; fail here first, naming ours.
        one_request = compat.one_request_kv_bytes(self.model_runner, self.vllm_config)
        cfg, num_seqs = self.settings.config, compat.max_num_seqs(self.vllm_config)
        left = available - scratch
        _raise_if_scratch_does_not_fit(cfg, num_seqs, available, scratch, one_request)
        logger.info(
            "SpecExtend compacted positions: the draft's scratch KV for %d "
            "tokens per request x %d requests takes %s of the %s KV cache "
            "budget; KV cache memory reduced to %s.",
            cfg.draft_budget_tokens,
            num_seqs,
            _size(scratch),
            _size(available),
            _size(left),
        )
        return left

    fits_draft_attention_heads = False
    """Whether the draft's attention builders get the draft layers' own query
    heads once they exist (``compat.draft_attention_heads``; the CPU worker)."""

    @override
    def initialize_from_config(self, kv_cache_config) -> None:
        super().initialize_from_config(kv_cache_config)
        if self.fits_draft_attention_heads:
            compat.draft_attention_heads(self.model_runner.drafter)
        # Before warm-up and graph capture, which bake in KV tensor addresses.
        self.model_runner.drafter.add_scratch_blocks()
        self.model_runner.drafter.warm_up_kernels()

    @override
    def compile_or_warm_up_model(self):
        result = super().compile_or_warm_up_model()
        # After vLLM's own capture: the draft model is compiled and the KV
        # cache (scratch blocks included) sits at its final addresses.
        self.model_runner.drafter.capture_graphs()
        return result

    def specextend_state(self) -> dict:
        """For ``collective_rpc("specextend_state")``: this rank's live request
        ids, the requests holding selection state or a slot, and the plugin's
        counters."""
        drafter = self.model_runner.drafter
        return {
            "live_requests": sorted(compat.live_req_ids(self.model_runner)),
            "tracked_requests": len(drafter.state),
            "request_slots": drafter.state.num_slots_held,
            "stats": drafter.stats.snapshot(),
            "draft_placement": getattr(drafter, "draft_placement", "sharded"),
            # What the "auto" keys became here (and a fill fitted to the graphs).
            "draft_prompt_pool": drafter.cfg.draft_prompt_pool,
            "draft_pool_fill": drafter.cfg.draft_pool_fill,
            "draft_prefill_window": drafter.cfg.draft_prefill_window,
            "lookup_tokens": drafter.cfg.lookup_tokens,
        }

    @override
    def execute_model(self, scheduler_output):
        done = set(scheduler_output.finished_req_ids)
        done |= scheduler_output.preempted_req_ids or set()
        drafter = self.model_runner.drafter
        if done:
            drafter.on_requests_done(done)
        if compat.copies_kv_blocks(scheduler_output):
            drafter.before_block_copies()
        return super().execute_model(scheduler_output)


def _raise_if_not_v1_runner(runner) -> None:
    if not hasattr(runner, "drafter"):
        # vLLM's V2 runner has its own speculator and would ignore ours.
        raise RuntimeError(
            f"--spec-extend needs vLLM's V1 model runner, got "
            f"{type(runner).__module__}; set VLLM_USE_V2_MODEL_RUNNER=0."
        )


def _raise_if_scratch_does_not_fit(
    cfg, num_seqs: int, available: int, scratch: int, one_request: int | None
) -> None:
    left = available - scratch
    if left > 0 and (one_request is None or left >= one_request):
        return
    need = "" if one_request is None else (
        f" plus {_size(one_request)} for one request of max_model_len"
    )
    raise SpecExtendConfigError(
        f"spec_extend.compact_positions: the draft's scratch KV needs "
        f"{_size(scratch)} (max_num_seqs={num_seqs} requests x "
        f"(sink_tokens={cfg.sink_tokens} + top_k={cfg.top_k} x "
        f"chunk_size={cfg.chunk_size}) tokens){need}, but the KV cache "
        f"budget is {_size(available)}. Lower max_num_seqs, "
        "top_k, chunk_size or sink_tokens, or raise "
        "gpu_memory_utilization / kv_cache_memory_bytes."
    )


def _size(nbytes: int) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.2f} GiB"
    return f"{nbytes / 2**20:.1f} MiB"
