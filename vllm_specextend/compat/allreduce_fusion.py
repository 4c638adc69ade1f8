"""vLLM's all-reduce + RMSNorm fusion off where NVLink multicast is off.

vLLM 0.26 turns the fusion on by itself at TP > 1 on Hopper and Blackwell
(``enable_allreduce_rms_fusion``) and picks FlashInfer's ``mnnvl`` backend
for it (``VLLM_FLASHINFER_ALLREDUCE_BACKEND=auto``), which needs NVLink
multicast. On a host that turns multicast off (``NCCL_NVLS_ENABLE=0``, as
shared hosts do: a program that uses it can take the host's GPUs out of
service), CUDA-graph capture of an 8B engine at TP=2 crashed, plain engines
too; with ``fuse_allreduce_rms: false`` every engine captured and ran
(docs/results.md, "Tensor parallel"). So, under ``--spec-extend``, where the
user left both the fusion and the backend to vLLM and the host says
multicast is off, the plugin turns the fusion off and says so in one line.
Any explicit choice stands: ``-cc '{"pass_config": {"fuse_allreduce_rms":
true}}'`` or a named ``VLLM_FLASHINFER_ALLREDUCE_BACKEND``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from vllm_specextend import compat
from vllm_specextend.config import ADDITIONAL_CONFIG_KEY


def fusion_off_without_multicast(args, environ: Mapping[str, str] = os.environ) -> bool:
    """Before vLLM resolves ``args`` (its ``EngineArgs``): turn the fusion
    off where the conditions above hold. Returns whether it did."""
    if ADDITIONAL_CONFIG_KEY not in (args.additional_config or {}):
        return False
    if (args.tensor_parallel_size or 1) <= 1:
        return False
    if environ.get("NCCL_NVLS_ENABLE") != "0":
        return False  # multicast may be there: vLLM's choice stands
    if environ.get("VLLM_FLASHINFER_ALLREDUCE_BACKEND", "auto") != "auto":
        return False  # the user named a backend
    config = args.compilation_config
    passes = config.get("pass_config") if isinstance(config, dict) else config.pass_config
    if isinstance(passes, dict):
        if passes.get("fuse_allreduce_rms") is not None:
            return False
        passes["fuse_allreduce_rms"] = False
    elif passes is None:
        config["pass_config"] = {"fuse_allreduce_rms": False}
    else:
        if passes.fuse_allreduce_rms is not None:
            return False  # the user's choice
        passes.fuse_allreduce_rms = False
    compat.logger.info(
        "SpecExtend: all-reduce + RMSNorm fusion off at TP=%d: NCCL_NVLS_ENABLE=0 "
        "says NVLink multicast is off, which its auto-selected backend needs "
        "(-cc '{\"pass_config\": {\"fuse_allreduce_rms\": true}}' keeps it on).",
        args.tensor_parallel_size,
    )
    return True
