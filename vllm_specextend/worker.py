"""Workers that install SpecExtend's proposer as the runner's drafter.

vLLM 0.26 builds the model runner, and with it a plain DraftModelProposer or
EagleProposer, inside ``init_device``; the runner only type-checks its drafter
with ``isinstance``, so swapping in our subclass of the same class before
``load_model`` is enough.
The worker also forwards finished and preempted request ids, so per-request
state is freed when the scheduler lets go of a request, not when it is next
missing from a batch. ``--spec-extend`` selects these classes itself.
"""

from __future__ import annotations

from typing_extensions import override

from vllm_specextend import compat
from vllm_specextend.config import (
    ADDITIONAL_CONFIG_KEY,
    EngineFacts,
    SpecExtendConfig,
    validate_engine,
)


class _SpecExtendWorkerMixin:
    @override
    def init_device(self):
        super().init_device()
        compat.check_touch_points()
        # Authoritative check: also covers configs built without our CLI hook.
        vllm_config = self.vllm_config
        cfg = SpecExtendConfig.from_dict(
            compat.additional_config(vllm_config).get(ADDITIONAL_CONFIG_KEY)
        )
        validate_engine(cfg, EngineFacts(**compat.engine_facts(vllm_config)))
        from vllm_specextend.proposer import PROPOSERS

        runner = self.model_runner
        proposer = PROPOSERS[vllm_config.speculative_config.method]
        runner.drafter = proposer(vllm_config, runner.device, runner=runner)

    @override
    def initialize_from_config(self, kv_cache_config) -> None:
        super().initialize_from_config(kv_cache_config)
        # Before warm-up and graph capture, which bake in KV tensor addresses.
        self.model_runner.drafter.add_scratch_blocks()

    def specextend_state(self) -> dict:
        """For ``collective_rpc("specextend_state")``: this rank's live request
        ids, the requests holding selection state, and the plugin's counters."""
        drafter = self.model_runner.drafter
        return {
            "live_requests": sorted(compat.live_req_ids(self.model_runner)),
            "tracked_requests": len(drafter.store),
            "stats": drafter.stats.snapshot(),
        }

    @override
    def execute_model(self, scheduler_output):
        done = set(scheduler_output.finished_req_ids)
        done |= scheduler_output.preempted_req_ids or set()
        if done:
            self.model_runner.drafter.on_requests_done(done)
        return super().execute_model(scheduler_output)


_BASES = {"GPUWorker": "GPUWorkerBase", "CPUWorker": "CPUWorkerBase"}


def __getattr__(name: str):
    """``GPUWorker`` / ``CPUWorker``, built on first use so that a platform
    never imports the other platform's worker module."""
    if name not in _BASES:
        raise AttributeError(name)
    cls = type(name, (_SpecExtendWorkerMixin, getattr(compat, _BASES[name])), {})
    cls.__module__ = __name__
    cls.__doc__ = f"vLLM's {_BASES[name][:3]} worker with SpecExtend drafting."
    globals()[name] = cls
    return cls
