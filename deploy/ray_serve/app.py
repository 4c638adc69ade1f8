"""Ray Serve LLM application: vLLM draft-model speculative decoding + SpecExtend.

Built on ``ray.serve.llm`` (``LLMConfig`` + ``build_openai_app``) of Ray 2.58.1,
the release whose ``ray[llm]`` extra pins ``vllm==0.26.0``. The module imports
without Ray (``ray`` is imported inside :func:`build_app`), so
:func:`llm_config_kwargs` is unit-tested anywhere; ``tests/deploy/test_ray_serve.py``
runs the app for real on CPU (``deploy/README.md``).

Every Ray worker that hosts a replica needs ``vllm==0.26.0`` and this plugin
installed (the ``docker/Dockerfile`` image with ``ray[serve]==2.58.1`` added, or
a ``runtime_env``). vLLM loads the plugin through its ``vllm.general_plugins``
entry point; because ``additional_config`` has a ``spec_extend`` key, the plugin
validates it and swaps in its worker, as with ``vllm serve --spec-extend``.

Usage, from the repository root (``deploy/`` must be importable on the cluster)::

    serve run deploy/ray_serve/config.yaml
    serve run deploy.ray_serve.app:app_builder \\
        target=meta-llama/Llama-3.1-8B-Instruct \\
        draft=meta-llama/Llama-3.2-1B-Instruct \\
        spec_extend='{"top_k": 32, "retrieve_every": 4}' replicas=2

``serve run MODULE:FUNCTION key=value ...`` calls the application builder with
a dict of strings; a config file's ``args`` may also hold mappings and numbers.
The app serves the OpenAI API (``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``); the model id is ``model_id`` (default: the target's name).

API key: the builder reads the key from the environment variable named by
``api_key_env`` (``VLLM_API_KEY``, as ``vllm serve`` does) where the
application is built (``serve run MODULE:FUNCTION``: the driver; a config
file: the build task Serve runs on the cluster), checks it
(``vllm_specextend.serving.auth.check_key``) and refuses to build without one unless
``require_api_key=false``. Ray Serve LLM has no key of its own, so the ingress
is assembled as Ray's ``build_openai_app`` assembles it, on a FastAPI app that
carries ``vllm_specextend.auth.ApiKeyMiddleware`` with that key: every path
but ``/health`` and ``/metrics`` needs it. The key is therefore part of the
built application, which Serve pickles and keeps (in its controller's state)
to start the ingress replicas, which do not read it from their environment.
It is never a builder argument, so it is in no Serve config file or command
line.
"""

from __future__ import annotations

import json
import os
from typing import Any

DEFAULT_TARGET = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_DRAFT = "meta-llama/Llama-3.2-1B-Instruct"
DEFAULT_SPEC_EXTEND: dict[str, Any] = {"top_k": 32, "retrieve_every": 4}
DEFAULT_REPLICAS = 2
DEFAULT_NUM_SPECULATIVE_TOKENS = 4
# "gpu" is Ray Serve LLM's default placement (one GPU per engine); "cpu" asks
# for CPU bundles only and vLLM's "mp" executor (vLLM's CPU build).
ACCELERATORS = ("gpu", "cpu")


def _mapping(name: str, value: dict[str, Any] | str | None) -> dict[str, Any]:
    """A dict argument given as a dict (config file) or JSON text (``k=v``)."""
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as e:
            raise ValueError(f"{name} must be a JSON object, got {value!r}: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object, got {value!r}")
    return value


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
    replicas: int | str = DEFAULT_REPLICAS,
    num_speculative_tokens: int | str = DEFAULT_NUM_SPECULATIVE_TOKENS,
    model_id: str | None = None,
    max_model_len: int | str | None = None,
    engine_kwargs: dict[str, Any] | str | None = None,
    accelerator: str = "gpu",
    tensor_parallel_size: int | str = 1,
) -> dict[str, Any]:
    """Keyword arguments for ``ray.serve.llm.LLMConfig``. Pure: no Ray needed.

    ``target`` and ``draft`` are Hugging Face ids or local checkpoint paths.
    ``engine_kwargs`` adds vLLM engine arguments (``dtype``, ``block_size``,
    ``kv_cache_memory_bytes``, ``enforce_eager``, ...) to the ones set here.
    ``tensor_parallel_size``: GPUs per replica (Ray Serve LLM places a
    replica's engine on that many GPUs of one node).
    """
    spec_extend = (dict(DEFAULT_SPEC_EXTEND) if spec_extend is None
                   else _mapping("spec_extend", spec_extend))
    _validate_spec_extend(spec_extend)
    if accelerator not in ACCELERATORS:
        raise ValueError(
            f"accelerator must be one of {ACCELERATORS}, got {accelerator!r}")
    replicas = int(replicas)
    tensor_parallel_size = int(tensor_parallel_size)
    if tensor_parallel_size < 1:
        raise ValueError(
            f"tensor_parallel_size must be 1 or more, got {tensor_parallel_size}")
    engine: dict[str, Any] = {
        "speculative_config": {
            "method": "draft_model",
            "model": draft,
            "num_speculative_tokens": int(num_speculative_tokens),
        },
        "additional_config": {"spec_extend": spec_extend},
        "tensor_parallel_size": tensor_parallel_size,
        # The plugin refuses pipeline parallelism (config/engine.py).
        "pipeline_parallel_size": 1,
    }
    if max_model_len is not None:
        engine["max_model_len"] = int(max_model_len)
    extra = _mapping("engine_kwargs", engine_kwargs)
    owned = sorted(set(extra) & {*engine, "max_model_len"})
    if owned:
        raise ValueError(
            f"engine_kwargs must not set {owned}: pass draft, spec_extend, "
            "num_speculative_tokens or max_model_len to the builder instead"
        )
    engine.update(extra)
    kwargs: dict[str, Any] = {
        "model_loading_config": {
            "model_id": model_id or target,
            "model_source": target,
        },
        "engine_kwargs": engine,
        "deployment_config": {
            "autoscaling_config": {
                "min_replicas": replicas,
                "initial_replicas": replicas,
                "max_replicas": replicas,
            },
        },
    }
    if accelerator == "cpu":
        kwargs["accelerator_config"] = {"kind": "cpu"}
    return kwargs


def api_key_from_env(api_key_env: str = "VLLM_API_KEY",
                     require_api_key: bool | str = True) -> str | None:
    """The key the OpenAI routes require, from ``api_key_env``; None only when
    ``require_api_key`` is false. No Ray needed (vLLM is: ``auth``)."""
    from vllm_specextend.serving.auth import check_key

    key = os.environ.get(api_key_env) or None
    if key is None and _flag("require_api_key", require_api_key):
        raise ValueError(
            f"no API key: set {api_key_env} where the application is built (the "
            "key clients send as `Authorization: Bearer <key>`), or pass "
            "require_api_key=false to serve the OpenAI routes to anyone"
        )
    # Checked here, at build time: the middleware would refuse it only in the
    # ingress replica, on its first request.
    return None if key is None else check_key(key, api_key_env)


def _flag(name: str, value: bool | str) -> bool:
    if isinstance(value, bool):
        return value
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def build_app(api_key_env: str = "VLLM_API_KEY", require_api_key: bool | str = True,
              **kwargs: Any):
    """The Ray Serve application (needs ``ray[serve]`` and vLLM)."""
    from ray.serve.llm import LLMConfig, build_openai_app

    llm_config = LLMConfig(**llm_config_kwargs(**kwargs))
    key = api_key_from_env(api_key_env, require_api_key)
    if key is None:
        return build_openai_app({"llm_configs": [llm_config]})
    return _guarded_openai_app(llm_config, key)


def _guarded_openai_app(llm_config, key: str):
    """Ray's OpenAI app for one model, its FastAPI app guarded by ``key``.

    Ray 2.58: the parts ``build_openai_app`` uses, public except Ray's FastAPI
    app factory (``init``: its exception, CORS and telemetry middlewares) and
    ``to_model_metadata``, which Ray's own ``OpenAiIngress`` example imports.
    """
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import (
        to_model_metadata,
    )
    from ray.llm._internal.serve.core.ingress.ingress import init as ingress_app
    from ray.serve.llm import build_llm_deployment
    from ray.serve.llm.ingress import OpenAiIngress, make_fastapi_ingress
    # The key on every path but /health and /metrics (vLLM's own middleware
    # guards only /v1, /v2 and /inference).
    from vllm_specextend.serving.auth import ApiKeyMiddleware

    app = ingress_app()
    app.add_middleware(ApiKeyMiddleware, api_key=key)
    model_id = llm_config.model_id
    return (
        serve.deployment(make_fastapi_ingress(OpenAiIngress, app=app))
        .options(**OpenAiIngress.get_deployment_options([llm_config]))
        .bind(
            llm_deployments={model_id: build_llm_deployment(llm_config)},
            model_cards={model_id: to_model_metadata(model_id, llm_config)},
        )
    )


def app_builder(args: dict[str, Any] | None = None):
    """Application builder for ``serve run`` (import path or config file).

    Keys: target, draft, spec_extend (JSON), replicas, num_speculative_tokens,
    model_id, max_model_len, engine_kwargs (JSON), accelerator (gpu or cpu),
    tensor_parallel_size (GPUs per replica, default 1), api_key_env (default VLLM_API_KEY), require_api_key (default true).
    """
    return build_app(**dict(args or {}))


if __name__ == "__main__":
    from ray import serve

    serve.run(build_app(), blocking=True)
