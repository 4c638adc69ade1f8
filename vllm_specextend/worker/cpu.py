"""``--worker-cls vllm_specextend.worker.cpu.CPUWorker``: vLLM's CPU worker
with SpecExtend drafting. Imports vLLM's CPU worker module; GPU hosts use
``worker.gpu``, which ``--spec-extend`` selects there."""

from __future__ import annotations

from vllm_specextend import compat
from vllm_specextend.worker.mixin import SpecExtendWorkerMixin


class CPUWorker(SpecExtendWorkerMixin, compat.CPUWorkerBase):
    """vLLM's CPU worker with SpecExtend drafting."""

    # vLLM's CPU attention builders count the target's query heads, not the
    # draft's (compat.CPU_DRAFT_ATTENTION_HEADS).
    fits_draft_attention_heads = True
