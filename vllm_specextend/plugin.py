"""The ``vllm.general_plugins`` entry point.

vLLM loads it in every process (API server, engine core, workers) before the
CLI parser and the worker class are built. It checks the vLLM pin, adds the CLI
flags, hooks engine-config creation and registers the /metrics collector.
Idempotent; failures raise, so startup stops instead of silently running
without the plugin.
"""

from __future__ import annotations

_registered = False


def on_engine_config(vllm_config) -> None:
    """Validate ``spec_extend`` against the resolved engine, pick our worker."""
    from vllm_specextend import compat
    from vllm_specextend.config import (
        ADDITIONAL_CONFIG_KEY,
        EngineFacts,
        SpecExtendConfig,
        validate_engine,
    )

    raw = compat.additional_config(vllm_config).get(ADDITIONAL_CONFIG_KEY)
    if raw is None:
        return
    cfg = SpecExtendConfig.from_dict(raw)
    validate_engine(cfg, EngineFacts(**compat.engine_facts(vllm_config)))
    compat.require_v1_model_runner(vllm_config)
    worker_cls = compat.select_worker_cls(vllm_config)
    compat.logger.info("SpecExtend %s with worker %s", cfg.policy, worker_cls)


def register() -> None:
    global _registered
    if _registered:
        return
    from vllm_specextend import cli, compat, metrics, self_draft

    compat.check_vllm_version()
    compat.patch_engine_args(
        cli.add_spec_extend_args, on_engine_config, self_draft.speculative_config_for
    )
    metrics.install_collector()
    _registered = True
