"""The engines a benchmark compares, as the settings each adds to the ones all
modes share: the only place that says how a mode differs from plain decoding.

* ``plain``: no speculation.
* ``draft_model``: vLLM's own speculation (``method``: draft_model, eagle,
  eagle3), full KV, plugin off.
* ``spec_extend``: the same plus ``additional_config={"spec_extend": ...}``.
* ``self_draft``: the target drafts for itself through the view
  (``{"spec_extend": {"self_draft": true, ...}}``, no draft model); K and the
  synthetic acceptance go in a ``speculative_config`` without a model, which
  the plugin completes (method draft_model, the target as its draft).

``acceptance_length`` > 0 swaps vLLM's rejection sampler for its synthetic one
at that mean acceptance length (random weights: every speculative mode then
verifies the same number of tokens per step, and only the cost differs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MODES = ("plain", "draft_model", "spec_extend", "self_draft")
PLUGIN_MODES = ("spec_extend", "self_draft")
METHODS = ("draft_model", "eagle", "eagle3")
# Every name a result row's mode can have (``label``), in table order.
LABELS = ("plain", *METHODS, *PLUGIN_MODES)


@dataclass
class Speculation:
    draft: str | None = None
    method: str = "draft_model"
    num_spec_tokens: int = 4
    acceptance_length: float = 0.0
    spec_extend: dict = field(default_factory=dict)


def plugin_gap(mode_names) -> str | None:
    """Why the plugin's modes cannot run in this Python: the plugin's
    ``vllm.general_plugins`` entry point is not installed, so ``vllm serve``
    refuses ``--spec-extend`` (argparse exits 2; seen 2026-11-29 on a GPU host
    whose wheel install was skipped, after the plain server had run) and
    ``LLM`` ignores ``additional_config`` (bench_decode would time vLLM's own
    speculation under the plugin's name). None when no such mode is asked
    for or the entry point is there."""
    if not any(m in PLUGIN_MODES for m in mode_names):
        return None
    from importlib.metadata import entry_points

    plugins = entry_points(group="vllm.general_plugins")
    if any(ep.name == "specextend" for ep in plugins):
        return None
    return ("the spec_extend and self_draft modes need the plugin installed where "
            "vLLM runs (its vllm.general_plugins entry point is missing): "
            "`pip install .` (on a GPU host, `benchmarks/gpu/host_run.sh` "
            "installs the wheel where it is missing)")


def needs_draft(mode: str) -> bool:
    return mode in ("draft_model", "spec_extend")


def label(mode: str, spec: Speculation) -> str:
    """The mode's name in result rows: vLLM's speculation without the plugin
    is named after its method, so eagle3 rows say eagle3."""
    return spec.method if mode == "draft_model" else mode


def engine_settings(mode: str, spec: Speculation) -> dict:
    """What ``mode`` adds to the shared engine settings (``LLM``/``EngineArgs``
    keyword arguments)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    settings: dict = {}
    if needs_draft(mode) and spec.draft is None:
        raise ValueError(f"mode {mode} needs a draft model")
    if mode != "plain":
        speculative = {"num_speculative_tokens": spec.num_spec_tokens}
        if needs_draft(mode):
            speculative.update(method=spec.method, model=spec.draft)
        if spec.acceptance_length > 0:
            speculative.update(rejection_sample_method="synthetic",
                               synthetic_acceptance_length=spec.acceptance_length)
        settings["speculative_config"] = speculative
    if mode == "spec_extend":
        settings["additional_config"] = {"spec_extend": dict(spec.spec_extend)}
    if mode == "self_draft":
        settings["additional_config"] = {
            "spec_extend": {**spec.spec_extend, "self_draft": True}}
    return settings


def serve_flags(settings: dict) -> list[str]:
    """``engine_settings`` as ``vllm serve`` flags (``--spec-extend`` for the
    plugin's config, as users pass it)."""
    flags = []
    if "speculative_config" in settings:
        flags += ["--speculative-config", json.dumps(settings["speculative_config"])]
    if "additional_config" in settings:
        flags += ["--spec-extend",
                  json.dumps(settings["additional_config"]["spec_extend"])]
    return flags
