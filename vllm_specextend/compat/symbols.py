"""The plugin's logger and the vLLM classes it names, loaded on first use.

Worker, proposer and engine-argument classes import large parts of vLLM (a
platform's worker module may not even import on another platform), so they
are resolved by name when first asked for: the entry point stays cheap in the
API server and a CPU host never imports the GPU worker.
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm.logger import init_logger

# A child of the "vllm" logger, so vLLM's handler, format and level apply.
logger = init_logger("vllm.plugins.specextend")

LAZY = {
    "DraftModelProposer": ("vllm.v1.spec_decode.draft_model", "DraftModelProposer"),
    "EagleProposer": ("vllm.v1.spec_decode.eagle", "EagleProposer"),
    "GPUWorkerBase": ("vllm.v1.worker.gpu_worker", "Worker"),
    "GPUModelRunner": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
    "CPUWorkerBase": ("vllm.v1.worker.cpu_worker", "CPUWorker"),
    "CommonAttentionMetadata": ("vllm.v1.attention.backend", "CommonAttentionMetadata"),
    "CUDAGraphMode": ("vllm.config", "CUDAGraphMode"),
    "EngineArgs": ("vllm.engine.arg_utils", "EngineArgs"),
    # The API server's own token check; ``auth.ApiKeyMiddleware`` subclasses it.
    "AuthenticationMiddleware": ("vllm.entrypoints.serve.utils.server_utils",
                                 "AuthenticationMiddleware"),
}


def load(name: str) -> Any:
    """The vLLM class ``LAZY[name]`` names; AttributeError for other names, so
    that a package ``__getattr__`` can delegate here."""
    if name not in LAZY:
        raise AttributeError(name)
    module, attr = LAZY[name]
    return getattr(importlib.import_module(module), attr)
