"""The ``vllm.general_plugins`` entry point.

vLLM loads it in every process (API server, engine core, workers) before the
CLI parser and the worker class are built. ``register`` checks the vLLM pin
and applies the process-wide patches (``compat.patches``): every engine
parser gets our flags (:func:`on_cli_parser`), every engine's arguments go
through :func:`on_engine_args` before its config resolves (and
:func:`on_batch_defaults` once vLLM set its step budget) and every resolved
config through :func:`on_engine_config`. Idempotent; failures raise, so startup
stops instead of silently running without the plugin.
"""

from __future__ import annotations

_registered = False


def on_cli_parser(parser) -> None:
    """Each parser vLLM builds from ``EngineArgs``: our flags, and config
    errors found later, when the engine config resolves, reported in one line
    as argparse reports the parser's own errors."""
    from vllm_specextend.serving import cli

    cli.add_spec_extend_args(parser)
    cli.report_config_errors_briefly()


def on_engine_args(args) -> None:
    """Before each engine config resolves: what ``--spec-extend`` implies for
    vLLM's own arguments (the speculative config of ``self_draft``, async
    scheduling, the all-reduce fusion on hosts without NVLink multicast)."""
    from vllm_specextend.compat import allreduce_fusion
    from vllm_specextend.drafting import self_draft
    from vllm_specextend.serving import scheduling

    self_draft.speculative_config_for(args)
    scheduling.async_by_default(args)
    allreduce_fusion.fusion_off_without_multicast(args)


def on_batch_defaults(args, defaults) -> None:
    """Once vLLM has set its default step budget on ``args``: keep it for the
    target's tokens, the draft's slots on top (``scheduling.plain_step_budget``)."""
    from vllm_specextend.serving import scheduling

    scheduling.plain_step_budget(args, defaults)


def on_engine_config(vllm_config) -> None:
    """With ``spec_extend`` set: validate it against the resolved engine, pick
    our worker and the V1 runner, and export its /metrics series."""
    from vllm_specextend import compat
    from vllm_specextend.serving import metrics
    from vllm_specextend.serving.settings import Settings, enabled

    if not enabled(vllm_config):
        return
    settings = Settings.from_vllm(vllm_config)
    _hash_draft_placement(vllm_config, settings)
    compat.require_v1_model_runner(vllm_config)
    worker_cls = compat.select_worker_cls(vllm_config)
    metrics.install_collector(
        compat.served_model_name(vllm_config),
        compat.engine_indexes(vllm_config),
        warn=compat.logger.warning,
    )
    compat.logger.info(
        "SpecExtend %s with worker %s", settings.config.policy, worker_cls
    )
    if settings.prompt_pool_note is not None:
        compat.logger.info("SpecExtend draft_prompt_pool auto: %s",
                           settings.prompt_pool_note)
    if settings.prefill_window_note is not None:
        compat.logger.info("SpecExtend draft_prefill_window auto: %s",
                           settings.prefill_window_note)
    if settings.lookup_note is not None:
        compat.logger.info("SpecExtend lookup_tokens auto: %s", settings.lookup_note)
    if settings.pool_fill_note is not None:
        compat.logger.info("SpecExtend draft_pool_fill: %s", settings.pool_fill_note)


def _hash_draft_placement(vllm_config, settings) -> None:
    """The resolved draft placement into ``spec_extend``, so into the config's
    hash: vLLM 0.26 keys its compile cache by that hash and each piece's shape,
    not by the traced graph, so a sharded draft's cached pieces must never be
    found for a replicated one (vLLM's own reason to refuse a draft TP that
    differs from the target's)."""
    from vllm_specextend import compat
    from vllm_specextend.config import ADDITIONAL_CONFIG_KEY

    extra = compat.additional_config(vllm_config)
    extra[ADDITIONAL_CONFIG_KEY] = {
        **(extra.get(ADDITIONAL_CONFIG_KEY) or {}),
        "draft_placement": "replicated" if settings.replicated_draft else "sharded",
    }


def register() -> None:
    global _registered
    if _registered:
        return
    from vllm_specextend import compat

    compat.check_vllm_version()
    compat.apply_process_patches(on_cli_parser, on_engine_config, on_engine_args,
                                 on_batch_defaults)
    _registered = True
