"""The ``vllm serve`` flags and environment of the CPU server tests (tiny
models, fp32), shared by the plugin's server tests and the serving benchmark's."""

from __future__ import annotations

import os

SPEC_EXTEND = '{"min_context": 128, "top_k": 2, "recent_tokens": 64}'
MAX_MODEL_LEN = 2048


def common(max_model_len: int = MAX_MODEL_LEN, kv_cache_bytes: str = "1G") -> list[str]:
    """The CPU flags; ``max_model_len`` up to the model's positions."""
    return ["--block-size", "32", "--kv-cache-memory-bytes", kv_cache_bytes,
            "--max-model-len", str(max_model_len), "--dtype", "float32",
            "--enforce-eager", "--seed", "0"]


COMMON = common()
# The plugin's API-key middleware, as the deployments start the server.
MIDDLEWARE = ["--middleware", "vllm_specextend.auth.ApiKeyMiddleware"]


def spec_args(draft: str, spec_extend: str = SPEC_EXTEND) -> list[str]:
    """SpecExtend with ``draft`` drafting 3 tokens."""
    return ["--speculative-model", draft, "--num-speculative-tokens", "3",
            "--spec-extend", spec_extend]

STARTUP_S = 300
# Bytecode beside the sources (the venv's own), for faster server starts.
ENV = {**os.environ, "VLLM_LOG_STATS_INTERVAL": "1"}
ENV.pop("PYTHONDONTWRITEBYTECODE", None)
