"""Workers that install SpecExtendProposer as the runner's drafter.

vLLM 0.26 builds the model runner, and with it a plain DraftModelProposer,
inside ``init_device``; the runner only type-checks its drafter with
``isinstance``, so swapping in the subclass before ``load_model`` is enough.
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
        from vllm_specextend.proposer import SpecExtendProposer

        runner = self.model_runner
        runner.drafter = SpecExtendProposer(vllm_config, runner.device, runner=runner)

    @override
    def execute_model(self, scheduler_output):
        done = set(scheduler_output.finished_req_ids)
        done |= scheduler_output.preempted_req_ids or set()
        if done:
            self.model_runner.drafter.on_requests_done(done)
        return super().execute_model(scheduler_output)


class GPUWorker(_SpecExtendWorkerMixin, compat.GPUWorkerBase):
    """``vllm.v1.worker.gpu_worker.Worker`` with SpecExtend drafting."""


class CPUWorker(_SpecExtendWorkerMixin, compat.CPUWorkerBase):
    """``vllm.v1.worker.cpu_worker.CPUWorker`` with SpecExtend drafting."""
