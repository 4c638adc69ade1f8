"""``--worker-cls vllm_specextend.worker.gpu.GPUWorker``: vLLM's GPU worker
with SpecExtend drafting. Imports vLLM's GPU worker module; CPU hosts use
``worker.cpu``, which ``--spec-extend`` selects there."""

from __future__ import annotations

from vllm_specextend import compat
from vllm_specextend.worker.mixin import SpecExtendWorkerMixin


class GPUWorker(SpecExtendWorkerMixin, compat.GPUWorkerBase):
    """vLLM's GPU worker with SpecExtend drafting."""
