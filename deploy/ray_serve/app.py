"""Ray Serve LLM application: vLLM draft-model speculative decoding + SpecExtend.

Untested here: Ray is not installed on this project's CI machine. The module is
import-safe without Ray (``ray`` is imported inside :func:`build_app`), and
``tests/unit/test_deploy.py`` checks the engine settings built by
:func:`llm_config_kwargs`. Written against the ``ray.serve.llm`` API of Ray 2.x
(``LLMConfig`` + ``build_openai_app``) with vLLM 0.26.

Every Ray worker that hosts a replica needs ``vllm==0.26.0`` and this plugin
installed (for example the ``docker/Dockerfile`` image with Ray added, or a
``runtime_env`` with ``pip: ["vllm-specextend"]``). vLLM loads the plugin through
its ``vllm.general_plugins`` entry point; because ``additional_config`` has a
``spec_extend`` key, the plugin validates it and swaps in its worker.

Usage, from the repository root::

    serve run deploy.ray_serve.app:app_builder
    serve run deploy.ray_serve.app:app_builder \\
        target=meta-llama/Llama-3.1-8B-Instruct \\
        draft=meta-llama/Llama-3.2-1B-Instruct \\
        spec_extend='{"top_k": 32, "retrieve_every": 4}' replicas=2

``serve run MODULE:FUNCTION key=value ...`` calls an application builder with a
dict of the ``key=value`` arguments (all strings). The app serves the OpenAI API
on port 8000 (``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``);
the model id is ``model_id`` (default: the target's name).

``python deploy/ray_serve/app.py`` builds the app with the defaults and runs it
with ``serve.run`` (blocking).
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_TARGET = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_DRAFT = "meta-llama/Llama-3.2-1B-Instruct"
DEFAULT_SPEC_EXTEND: dict[str, Any] = {"top_k": 32, "retrieve_every": 4}
DEFAULT_REPLICAS = 2
DEFAULT_NUM_SPECULATIVE_TOKENS = 4


def _validate_spec_extend(spec_extend: dict[str, Any]) -> None:
    """Fail early (at build time, on the driver) on a bad ``spec_extend`` dict."""
    try:
        from vllm_specextend.config import SpecExtendConfig
    except ImportError:  # plugin not on the driver: replicas still validate it
        return
    SpecExtendConfig.from_dict(spec_extend)


def llm_config_kwargs(
    target: str = DEFAULT_TARGET,
    draft: str = DEFAULT_DRAFT,
    spec_extend: dict[str, Any] | str | None = None,
    replicas: int = DEFAULT_REPLICAS,
    num_speculative_tokens: int = DEFAULT_NUM_SPECULATIVE_TOKENS,
    model_id: str | None = None,
    max_model_len: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``ray.serve.llm.LLMConfig``. Pure: no Ray needed."""
    if spec_extend is None:
        spec_extend = dict(DEFAULT_SPEC_EXTEND)
    elif isinstance(spec_extend, str):
        spec_extend = json.loads(spec_extend) if spec_extend.strip() else {}
    _validate_spec_extend(spec_extend)
    replicas = int(replicas)
    engine_kwargs: dict[str, Any] = {
        "speculative_config": {
            "method": "draft_model",
            "model": draft,
            "num_speculative_tokens": int(num_speculative_tokens),
        },
        "additional_config": {"spec_extend": spec_extend},
        # The plugin supports tensor and pipeline parallel size 1 only.
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
    }
    if max_model_len is not None:
        engine_kwargs["max_model_len"] = int(max_model_len)
    return {
        "model_loading_config": {
            "model_id": model_id or target,
            "model_source": target,
        },
        "engine_kwargs": engine_kwargs,
        "deployment_config": {
            "autoscaling_config": {
                "min_replicas": replicas,
                "initial_replicas": replicas,
                "max_replicas": replicas,
            },
        },
    }


def build_app(**kwargs: Any):
    """The Ray Serve application (needs ``ray[serve,llm]``)."""
    from ray.serve.llm import LLMConfig, build_openai_app

    llm_config = LLMConfig(**llm_config_kwargs(**kwargs))
    return build_openai_app({"llm_configs": [llm_config]})


def app_builder(args: dict[str, str] | None = None):
    """Application builder for ``serve run deploy.ray_serve.app:app_builder k=v``.

    Keys: target, draft, spec_extend (JSON), replicas, num_speculative_tokens,
    model_id, max_model_len.
    """
    return build_app(**dict(args or {}))


if __name__ == "__main__":
    from ray import serve

    app = build_app()
    serve.run(app, blocking=True)
