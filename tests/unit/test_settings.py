"""Settings: the spec_extend config, engine facts and decisions, resolved once."""

from __future__ import annotations

import dataclasses
import gc
import types

import pytest

from vllm_specextend.config import EngineFacts, SpecExtendConfig, SpecExtendConfigError
from vllm_specextend.serving import settings as settings_mod
from vllm_specextend.serving.settings import Settings, enabled


def _facts(**kw) -> EngineFacts:
    base = dict(has_speculative_config=True, method="draft_model", block_size=16,
                tensor_parallel_size=1, pipeline_parallel_size=1,
                max_model_len=4096, draft_max_model_len=4096,
                num_speculative_tokens=3)
    return EngineFacts(**{**base, **kw})


class _VllmConfig:
    """Stands in for VllmConfig (weak-referenceable, as the real one)."""

    def __init__(self, spec_extend=None, draft_max_model_len=4096):
        self.additional_config = (
            {} if spec_extend is None else {"spec_extend": spec_extend}
        )
        self.speculative_config = types.SimpleNamespace(
            method="draft_model", disable_padded_drafter_batch=False,
            draft_model_config=types.SimpleNamespace(max_model_len=draft_max_model_len,
                                                     model="draft"),
            num_speculative_tokens=3,
        )
        self.cache_config = types.SimpleNamespace(block_size=16, cache_dtype="auto")
        self.model_config = types.SimpleNamespace(
            max_model_len=4096, model="target",
            get_num_layers_by_block_type=lambda parallel, kind: 4,
        )
        self.parallel_config = types.SimpleNamespace(
            tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_rank=1
        )


def test_resolve_draws_the_decisions():
    cfg = SpecExtendConfig(top_k=2, recent_tokens=64, retrieve_every=2,
                           draft_prompt_pool=None, lookup_tokens=0,
                           draft_prefill_window=None, draft_pool_fill=None)
    full = Settings.resolve(cfg, _facts())
    assert not full.compaction_on and full.draft_len is None
    assert full.min_view_context == cfg.min_context
    short = Settings.resolve(cfg, _facts(draft_max_model_len=256), engine_index=3)
    assert short.compaction_on and short.draft_len == 256
    assert short.min_view_context == cfg.min_view_context(256, 3) == 249
    assert short.engine_index == 3 and short.config is cfg


def test_resolve_validates():
    with pytest.raises(SpecExtendConfigError, match="--block-size"):
        Settings.resolve(SpecExtendConfig(chunk_size=24, sink_tokens=0), _facts())
    with pytest.raises(SpecExtendConfigError, match="needs a draft model"):
        Settings.resolve(SpecExtendConfig(), _facts(has_speculative_config=False))


def test_from_vllm_resolves_once_per_config_object(monkeypatch):
    calls = []
    resolve = Settings.resolve.__func__
    monkeypatch.setattr(Settings, "resolve", classmethod(
        lambda cls, *a: calls.append(a) or resolve(cls, *a)))
    vllm_config = _VllmConfig({"top_k": 4}, draft_max_model_len=1024)
    first = Settings.from_vllm(vllm_config)
    assert Settings.from_vllm(vllm_config) is first and len(calls) == 1
    assert first.config.top_k == 4 and first.compaction_on and first.engine_index == 1
    other = Settings.from_vllm(_VllmConfig({"top_k": 5}))
    assert other.config.top_k == 5 and len(calls) == 2
    key = id(vllm_config)
    del vllm_config
    gc.collect()
    assert key not in settings_mod._RESOLVED


def test_from_vllm_without_spec_extend_uses_defaults():
    vllm_config = _VllmConfig()
    assert not enabled(vllm_config)
    resolved = Settings.from_vllm(vllm_config)
    # The defaults on a 4K engine: no prompt long enough to pool, so the
    # draft's full pass, windowed (draft_prefill_window "auto"), no fill;
    # lookup_tokens "auto" off at K=3.
    defaults = dataclasses.replace(SpecExtendConfig(), lookup_tokens=0,
                                   draft_prefill_window=4096, draft_prompt_pool=None,
                                   draft_pool_fill=None)
    assert resolved.config == defaults
    assert "max_model_len=4096" in resolved.prompt_pool_note
    assert resolved.pool_fill_note is None
    assert resolved.prefill_window_note == "4096 tokens before each prompt piece"
    assert resolved.lookup_note == ("off (num_speculative_tokens=3 is below 8, "
                                    "from which it is measured)")
    assert enabled(_VllmConfig({}))
    # "auto" resolved: no 4K prompt is long enough to pool.
    pooled = Settings.from_vllm(_VllmConfig({"draft_prompt_pool": "auto"}))
    assert pooled.config == defaults
    assert "max_model_len=4096" in pooled.prompt_pool_note
