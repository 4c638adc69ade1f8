"""SpecExtendConfig parsing/validation and validate_engine (no vLLM)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from vllm_specextend.config import (
    ADDITIONAL_CONFIG_KEY,
    AUTO_POOL_FILL,
    AUTO_POOL_PER_TOP_K,
    AUTO_PREFILL_WINDOW,
    POLICIES,
    EngineFacts,
    SpecExtendConfig,
    SpecExtendConfigError,
    resolve_lookup,
    resolve_pool_fill,
    resolve_prefill_window,
    resolve_prompt_pool,
    validate_engine,
)
from vllm_specextend.serving.settings import Settings

VALID_KEYS = sorted(f.name for f in dataclasses.fields(SpecExtendConfig))


def good_facts(**overrides) -> EngineFacts:
    base = dict(
        has_speculative_config=True,
        method="draft_model",
        block_size=16,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        disable_padded_drafter_batch=False,
    )
    base.update(overrides)
    return EngineFacts(**base)


# --- defaults -------------------------------------------------------------------


def test_defaults_follow_the_paper_but_top_k():
    cfg = SpecExtendConfig()
    assert cfg.policy == "cmr"
    assert cfg.chunk_size == 32
    # 64, not the paper's 32: measured on the real pair (keys.py says where).
    assert cfg.top_k == 64
    assert cfg.retrieve_every == 4
    assert cfg.sink_tokens % cfg.chunk_size == 0
    assert ADDITIONAL_CONFIG_KEY == "spec_extend"
    assert set(POLICIES) == {"cmr", "streaming", "full"}


def test_to_dict_round_trip():
    cfg = SpecExtendConfig(policy="streaming", top_k=8, recent_tokens=64)
    d = cfg.to_dict()
    assert sorted(d) == VALID_KEYS
    assert SpecExtendConfig.from_dict(d) == cfg
    assert SpecExtendConfig.from_json(json.dumps(d)) == cfg


# --- from_json / from_dict ------------------------------------------------------


@pytest.mark.parametrize("text", [None, "", "   ", "\n"])
def test_from_json_empty_gives_defaults(text):
    assert SpecExtendConfig.from_json(text) == SpecExtendConfig()


def test_from_json_empty_object_gives_defaults():
    assert SpecExtendConfig.from_json("{}") == SpecExtendConfig()


@pytest.mark.parametrize(
    "raw", [5, "streaming", [["top_k", 3]], False, 0, ""],
    ids=["int", "str", "pairs", "false", "zero", "empty-str"],
)
def test_from_dict_rejects_non_mapping(raw):
    # additional_config["spec_extend"] comes from user JSON
    # (--additional-config '{"spec_extend": false}'): anything but an object or
    # null must be a SpecExtendConfigError, never a silent "defaults" or a
    # bare TypeError from dict().
    with pytest.raises(SpecExtendConfigError, match="spec_extend"):
        SpecExtendConfig.from_dict(raw)


def test_from_dict_none_gives_defaults():
    assert SpecExtendConfig.from_dict(None) == SpecExtendConfig()
    assert SpecExtendConfig.from_dict({}) == SpecExtendConfig()


def test_from_json_valid():
    cfg = SpecExtendConfig.from_json(
        '{"top_k": 64, "retrieve_every": 2, "policy": "streaming", "chunk_size": 16,'
        ' "sink_tokens": 48, "recent_tokens": 100, "min_context": 0}'
    )
    assert cfg.top_k == 64
    assert cfg.retrieve_every == 2
    assert cfg.policy == "streaming"
    assert cfg.chunk_size == 16
    assert cfg.sink_tokens == 48
    assert cfg.recent_tokens == 100
    assert cfg.min_context == 0


def test_from_json_does_not_mutate_input_dict():
    data = {"top_k": 5}
    SpecExtendConfig.from_dict(data)
    assert data == {"top_k": 5}


@pytest.mark.parametrize("text", ["{", "{'top_k': 3}", "top_k=3", '{"top_k": }'])
def test_from_json_invalid_json(text):
    with pytest.raises(SpecExtendConfigError, match="JSON object"):
        SpecExtendConfig.from_json(text)


@pytest.mark.parametrize("text", ["[1, 2]", "3", '"cmr"', "null", "true"])
def test_from_json_non_object(text):
    with pytest.raises(SpecExtendConfigError, match="JSON object"):
        SpecExtendConfig.from_json(text)


def test_config_error_is_value_error():
    assert issubclass(SpecExtendConfigError, ValueError)


def test_unknown_key_names_key_and_lists_valid_keys():
    with pytest.raises(SpecExtendConfigError) as info:
        SpecExtendConfig.from_json('{"topk": 3}')
    msg = str(info.value)
    assert "topk" in msg
    for key in VALID_KEYS:
        assert key in msg


def test_unknown_keys_all_named():
    with pytest.raises(SpecExtendConfigError) as info:
        SpecExtendConfig.from_dict({"zzz": 1, "aaa": 2, "top_k": 3})
    msg = str(info.value)
    assert "zzz" in msg and "aaa" in msg


# --- types and ranges -------------------------------------------------------------


@pytest.mark.parametrize(
    "key,value",
    [
        ("top_k", 0),
        ("top_k", -1),
        ("top_k", True),
        ("top_k", 1.5),
        ("top_k", "8"),
        ("top_k", None),
        ("chunk_size", 0),
        ("chunk_size", False),
        ("chunk_size", -32),
        ("retrieve_every", 0),
        ("retrieve_every", True),
        ("sink_tokens", -32),
        ("recent_tokens", -1),
        ("recent_tokens", 2.0),
        ("min_context", -1),
        ("min_context", False),
    ],
)
def test_bad_numbers_rejected(key, value):
    with pytest.raises(SpecExtendConfigError, match=key):
        SpecExtendConfig.from_dict({key: value})
    with pytest.raises(SpecExtendConfigError, match=key):
        SpecExtendConfig.from_json(json.dumps({key: value}))


@pytest.mark.parametrize("key", ["sink_tokens", "recent_tokens", "min_context"])
def test_zero_allowed_where_documented(key):
    cfg = SpecExtendConfig.from_dict({key: 0})
    assert getattr(cfg, key) == 0


def test_minimum_positive_values_accepted():
    cfg = SpecExtendConfig(chunk_size=1, top_k=1, retrieve_every=1, sink_tokens=0)
    assert (cfg.chunk_size, cfg.top_k, cfg.retrieve_every) == (1, 1, 1)


@pytest.mark.parametrize("policy", ["CMR", "stream", "", "none", 1, None])
def test_bad_policy(policy):
    with pytest.raises(SpecExtendConfigError, match="policy"):
        SpecExtendConfig.from_dict({"policy": policy})


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_accepted(policy):
    assert SpecExtendConfig.from_dict({"policy": policy}).policy == policy


def test_sink_tokens_must_be_whole_chunks():
    with pytest.raises(SpecExtendConfigError, match="sink_tokens"):
        SpecExtendConfig(chunk_size=32, sink_tokens=16)
    with pytest.raises(SpecExtendConfigError, match="multiple"):
        SpecExtendConfig.from_json('{"chunk_size": 64, "sink_tokens": 32}')
    assert SpecExtendConfig(chunk_size=16, sink_tokens=48).sink_tokens == 48
    assert SpecExtendConfig(chunk_size=64, sink_tokens=0).sink_tokens == 0


def test_config_is_frozen():
    cfg = SpecExtendConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.top_k = 3  # type: ignore[misc]


# --- derived sizes ------------------------------------------------------------------


def test_window_tokens_per_policy():
    kw = dict(chunk_size=16, top_k=5, recent_tokens=100, sink_tokens=32)
    assert SpecExtendConfig(policy="cmr", **kw).window_tokens == 100
    assert SpecExtendConfig(policy="full", **kw).window_tokens == 100
    assert SpecExtendConfig(policy="streaming", **kw).window_tokens == 100 + 5 * 16


def test_streaming_default_window():
    cfg = SpecExtendConfig(policy="streaming")
    assert cfg.window_tokens == cfg.recent_tokens + cfg.top_k * cfg.chunk_size
    assert cfg.window_tokens == 256 + 64 * 32


def test_draft_budget_tokens():
    cfg = SpecExtendConfig(chunk_size=16, top_k=5, sink_tokens=32)
    assert cfg.draft_budget_tokens == 32 + 5 * 16


# --- validate_engine ----------------------------------------------------------------


def test_validate_engine_accepts_good_setup():
    validate_engine(SpecExtendConfig(), good_facts())
    validate_engine(
        SpecExtendConfig(chunk_size=64, sink_tokens=64), good_facts(block_size=64)
    )
    validate_engine(SpecExtendConfig(chunk_size=32), good_facts(block_size=1))


def test_validate_engine_needs_speculative_config():
    with pytest.raises(SpecExtendConfigError, match="--speculative-model"):
        validate_engine(
            SpecExtendConfig(), good_facts(has_speculative_config=False, method=None)
        )


@pytest.mark.parametrize("method", ["ngram", "mtp", "medusa", None])
def test_validate_engine_rejects_other_methods(method):
    with pytest.raises(SpecExtendConfigError) as info:
        validate_engine(SpecExtendConfig(), good_facts(method=method))
    assert repr(method) in str(info.value)
    assert "draft_model" in str(info.value) and "eagle3" in str(info.value)


@pytest.mark.parametrize("method", ["draft_model", "eagle", "eagle3"])
def test_validate_engine_accepts_draft_and_eagle_methods(method):
    validate_engine(SpecExtendConfig(), good_facts(method=method))


@pytest.mark.parametrize("block_size,chunk", [(64, 32), (48, 32), (16, 24)])
def test_validate_engine_chunk_must_be_block_multiple(block_size, chunk):
    cfg = SpecExtendConfig(chunk_size=chunk, sink_tokens=0)
    with pytest.raises(SpecExtendConfigError) as info:
        validate_engine(cfg, good_facts(block_size=block_size))
    msg = str(info.value)
    assert f"--block-size {chunk}" in msg
    assert str(block_size) in msg


def test_validate_engine_accepts_tensor_parallel():
    validate_engine(SpecExtendConfig(), good_facts(tensor_parallel_size=2))


def test_validate_engine_rejects_pipeline_parallel():
    with pytest.raises(SpecExtendConfigError, match="PP=2"):
        validate_engine(SpecExtendConfig(), good_facts(pipeline_parallel_size=2))


def test_validate_engine_rejects_unpadded_drafter_batch():
    with pytest.raises(SpecExtendConfigError, match="disable_padded_drafter_batch"):
        validate_engine(
            SpecExtendConfig(), good_facts(disable_padded_drafter_batch=True)
        )


# --- compacted positions ----------------------------------------------------------

SHORT = dict(max_model_len=4096, draft_max_model_len=256, num_speculative_tokens=3)
FITS = {"chunk_size": 32, "top_k": 2, "sink_tokens": 32, "recent_tokens": 64,
        "retrieve_every": 2}


@pytest.mark.parametrize("value", ["yes", 1, None, "AUTO"])
def test_compact_positions_rejects_bad_values(value):
    with pytest.raises(SpecExtendConfigError, match="compact_positions"):
        SpecExtendConfig(compact_positions=value)


def test_compaction_auto_follows_draft_length():
    from vllm_specextend.config import compaction_on

    cfg = SpecExtendConfig()
    assert compaction_on(cfg, good_facts(**SHORT))
    assert not compaction_on(cfg, good_facts(max_model_len=4096,
                                             draft_max_model_len=4096))
    assert not compaction_on(cfg, good_facts())  # lengths unknown
    assert compaction_on(SpecExtendConfig(compact_positions=True), good_facts())
    assert not compaction_on(SpecExtendConfig(compact_positions=False),
                             good_facts(**SHORT))


def test_working_set_must_fit_the_draft():
    cfg = SpecExtendConfig(**FITS)
    # 32 + 2*32 + 64 + 2*4 + 32 + 6 = 206 <= 256
    assert cfg.working_set_tokens(3) == 206
    validate_engine(cfg, good_facts(**SHORT))
    with pytest.raises(SpecExtendConfigError, match="256.*lower top_k"):
        validate_engine(SpecExtendConfig(), good_facts(**SHORT))
    # Compaction off: the draft keeps real positions, nothing to fit.
    validate_engine(SpecExtendConfig(compact_positions=False), good_facts(**SHORT))


def test_min_view_context_keeps_long_rows_on_a_view():
    cfg = SpecExtendConfig(**FITS, min_context=2048)
    assert cfg.min_view_context(None, 3) == 2048
    assert cfg.min_view_context(4096, 3) == 2048
    assert cfg.min_view_context(256, 3) == 256 - 7


@pytest.mark.parametrize("key", ["self_draft", "defer_prefill_draft"])
@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_switches_take_only_booleans(key, value):
    with pytest.raises(SpecExtendConfigError, match=rf"spec_extend\.{key}=.* true or false"):
        SpecExtendConfig.from_dict({key: value})


def test_score_layer_defaults_to_the_final_layer():
    assert SpecExtendConfig().score_layer == -1
    assert SpecExtendConfig.from_dict({"score_layer": 21}).score_layer == 21
    assert SpecExtendConfig.from_dict({"score_layer": -9}).score_layer == -9


@pytest.mark.parametrize("value", [True, "21", 2.0, None])
def test_score_layer_must_be_an_integer(value):
    with pytest.raises(SpecExtendConfigError, match=r"spec_extend\.score_layer=.* integer"):
        SpecExtendConfig.from_dict({"score_layer": value})


@pytest.mark.parametrize("layer", [30, -31])
def test_validate_engine_rejects_a_score_layer_past_the_target(layer):
    cfg = SpecExtendConfig(score_layer=layer)
    with pytest.raises(SpecExtendConfigError, match=r"outside the target's 30 attention layers; use -30\.\.29"):
        validate_engine(cfg, good_facts(num_target_attention_layers=30))
    validate_engine(SpecExtendConfig(score_layer=29), good_facts(num_target_attention_layers=30))
    validate_engine(SpecExtendConfig(score_layer=-30), good_facts(num_target_attention_layers=30))


def test_draft_vocab_defaults_to_the_whole_vocabulary():
    assert SpecExtendConfig().draft_vocab is None
    assert SpecExtendConfig.from_json('{"draft_vocab": 32768}').draft_vocab == 32768
    assert SpecExtendConfig.from_dict({"draft_vocab": None}).draft_vocab is None


@pytest.mark.parametrize("value", [0, -5, True, "32768", 2.0])
def test_draft_vocab_must_be_a_positive_integer(value):
    with pytest.raises(SpecExtendConfigError, match=r"spec_extend\.draft_vocab=.* positive integer"):
        SpecExtendConfig.from_dict({"draft_vocab": value})


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_validate_engine_rejects_draft_vocab_for_eagle_heads(method):
    cfg = SpecExtendConfig(draft_vocab=1000)
    with pytest.raises(SpecExtendConfigError, match="draft_vocab_size"):
        validate_engine(cfg, good_facts(method=method))
    validate_engine(cfg, good_facts(method="draft_model"))


def test_draft_prefill_window_defaults_to_auto_which_resolves_per_engine():
    # "auto": 4,096 where the engine can window a draft model's passes (the
    # real pair, 2026-12-06 night), full attention where it cannot, logged.
    assert SpecExtendConfig().draft_prefill_window == "auto"
    assert SpecExtendConfig.from_json('{"draft_prefill_window": 4096}').draft_prefill_window == 4096
    validate_engine(SpecExtendConfig(), good_facts(method="eagle3"))  # auto never fails
    full_pass = SpecExtendConfig(draft_prompt_pool=None)  # else the pool bounds it
    cfg, note = resolve_prefill_window(full_pass, good_facts(**LONG))
    assert cfg.draft_prefill_window == AUTO_PREFILL_WINDOW == 4096
    assert note == "4096 tokens before each prompt piece"


@pytest.mark.parametrize("cfg, facts, why", [
    ({}, {"method": "eagle3"}, "the eagle3 head writes no draft KV"),
    ({"self_draft": True}, {"model": "t", "draft_model": "t"}, "self_draft writes no"),
    ({}, {"max_model_len": 65536, "draft_max_model_len": 8192}, "compacted"),
    ({"policy": "full"}, {}, 'policy "full" builds no view'),
    ({"draft_prompt_pool": "auto"}, {}, "draft_prompt_pool bounds"),
    ({"draft_prompt_pool": 128}, {}, "draft_prompt_pool bounds"),
])
def test_auto_window_steps_aside_where_the_engine_cannot_window(cfg, facts, why):
    facts = good_facts(**{**LONG, **facts})
    cfg = SpecExtendConfig(**cfg)
    validate_engine(cfg, facts)
    cfg, _ = resolve_prompt_pool(cfg, facts)
    resolved, note = resolve_prefill_window(cfg, facts)
    assert resolved.draft_prefill_window is None
    assert note.startswith("full attention over every prompt (") and why in note


@pytest.mark.parametrize("value", [None, 2048])
def test_a_named_window_is_left_as_it_is(value):
    cfg = SpecExtendConfig(draft_prefill_window=value)
    assert resolve_prefill_window(cfg, good_facts(**LONG)) == (cfg, None)


@pytest.mark.parametrize("value", [0, -1, True, "4096", 4096.0])
def test_draft_prefill_window_must_be_a_positive_integer(value):
    with pytest.raises(SpecExtendConfigError,
                       match=r"spec_extend\.draft_prefill_window=.* positive integer"):
        SpecExtendConfig.from_dict({"draft_prefill_window": value})


@pytest.mark.parametrize("cfg, facts, match", [
    ({}, {"method": "eagle3"}, "the eagle3 head writes no draft KV"),
    ({"self_draft": True}, {"model": "t", "draft_model": "t"}, "self_draft writes no draft KV"),
    ({"compact_positions": True}, {}, "compacted"),
    ({}, {"max_model_len": 65536, "draft_max_model_len": 2048}, "compacted"),
    ({"policy": "full"}, {}, 'policy "full" never builds'),
])
def test_validate_engine_refuses_a_prefill_window_it_cannot_serve(cfg, facts, match):
    cfg = SpecExtendConfig(draft_prefill_window=1024, **cfg)
    with pytest.raises(SpecExtendConfigError, match=match):
        validate_engine(cfg, good_facts(**facts))


def test_validate_engine_takes_a_prefill_window_for_a_draft_model():
    validate_engine(SpecExtendConfig(draft_prefill_window=1024),
                    good_facts(max_model_len=65536, draft_max_model_len=65536))


# --- draft placement ----------------------------------------------------------


@pytest.mark.parametrize("value", ["whole", "", None, 1])
def test_draft_placement_takes_only_its_names(value):
    with pytest.raises(SpecExtendConfigError, match=r"spec_extend\.draft_placement=.* one of"):
        SpecExtendConfig.from_dict({"draft_placement": value})


@pytest.mark.parametrize("placement, tp, method, self_draft, replicated", [
    ("auto", 1, "draft_model", False, False),  # one rank: nothing to place
    ("auto", 2, "draft_model", False, False),  # measured: sharded is faster
    ("auto", 4, "eagle3", False, False),
    ("sharded", 4, "draft_model", False, False),
    ("replicated", 4, "draft_model", False, True),
    ("replicated", 1, "draft_model", False, False),
])
def test_draft_placement_resolves(placement, tp, method, self_draft, replicated):
    from vllm_specextend.config import replicated_draft

    cfg = SpecExtendConfig(draft_placement=placement, self_draft=self_draft)
    assert replicated_draft(cfg, good_facts(tensor_parallel_size=tp, method=method)) \
        is replicated


@pytest.mark.parametrize("method, self_draft, match", [
    ("eagle3", False, "eagle3 head shares"),
    ("draft_model", True, "self_draft drafts with the target"),
])
def test_validate_engine_refuses_replicating_what_is_not_a_draft_model(
        method, self_draft, match):
    cfg = SpecExtendConfig(draft_placement="replicated", self_draft=self_draft)
    facts = good_facts(method=method, tensor_parallel_size=2,
                       model="m", draft_model="m" if self_draft else "d")
    with pytest.raises(SpecExtendConfigError, match=match):
        validate_engine(cfg, facts)


# --- draft prompt pool --------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, True, "128", 128.0, "Auto"])
def test_draft_prompt_pool_must_be_a_positive_integer(value):
    with pytest.raises(SpecExtendConfigError,
                       match=r'spec_extend\.draft_prompt_pool=.* positive integer .*"auto"'):
        SpecExtendConfig.from_dict({"draft_prompt_pool": value})


@pytest.mark.parametrize("cfg, facts, match", [
    ({}, {"method": "eagle3"}, "the eagle3 head writes no draft KV"),
    ({"self_draft": True}, {"model": "t", "draft_model": "t"}, "self_draft writes no draft KV"),
    ({"compact_positions": True}, {}, "compacted"),
    ({"policy": "streaming"}, {}, 'policy "streaming" never ranks'),
    ({"top_k": 64}, {}, "below top_k=64"),
    ({"draft_prefill_window": 2048}, {}, "set one of them"),
    ({}, {"data_parallel_size": 2}, "data parallel ranks"),
    # An M-RoPE target (Qwen2-VL's kin) with a text draft: positions of 3 rows.
    ({}, {"target_position_rows": 3}, r"3 rows \(M-RoPE or XD-RoPE\)\. Leave"),
    ({"chunk_size": 16}, {"num_speculative_tokens": 16}, "below chunk_size"),
])
def test_validate_engine_refuses_a_prompt_pool_it_cannot_serve(cfg, facts, match):
    cfg = SpecExtendConfig(**{"draft_prompt_pool": 32, "top_k": 32, **cfg})
    with pytest.raises(SpecExtendConfigError, match=match):
        validate_engine(cfg, good_facts(**facts))


@pytest.mark.parametrize("value", [0, -1, True, "16", 16.0, "Auto"])
def test_draft_pool_fill_must_be_a_positive_integer(value):
    with pytest.raises(SpecExtendConfigError,
                       match=r"spec_extend\.draft_pool_fill=.* positive integer"):
        SpecExtendConfig.from_dict({"draft_prompt_pool": 128, "draft_pool_fill": value})


def test_validate_engine_refuses_a_pool_fill_without_a_pool():
    cfg = SpecExtendConfig(draft_prompt_pool=None, draft_pool_fill=16)
    with pytest.raises(SpecExtendConfigError,
                       match="draft_pool_fill=16 adds chunks to a prompt pool, but "
                             "draft_prompt_pool is null. Set draft_prompt_pool"):
        validate_engine(cfg, good_facts())
    validate_engine(SpecExtendConfig(draft_prompt_pool=128, draft_pool_fill=16),
                    good_facts(max_model_len=65536, draft_max_model_len=65536))


def test_validate_engine_refuses_a_pool_fill_past_the_step_budget():
    cfg = SpecExtendConfig(draft_prompt_pool=128, draft_pool_fill=300)
    with pytest.raises(SpecExtendConfigError,
                       match=r"draft_pool_fill=300 fills 9600 tokens a request in one "
                             r"draft forward, more than max_num_batched_tokens=8192\. "
                             "Lower draft_pool_fill"):
        validate_engine(cfg, good_facts(max_model_len=65536, draft_max_model_len=65536,
                                        max_num_batched_tokens=8192))


def test_a_pool_fill_is_fitted_to_the_drafts_largest_cuda_graph():
    """16 chunks of 32 (512 tokens) pass the draft's largest graph at K = 12
    (507 tokens): the fill would run eagerly, so 15 chunks a fill, said in
    the start-up log; a fill that fits, or an eager draft, stays."""
    cfg = SpecExtendConfig(draft_prompt_pool=128, draft_pool_fill=16)
    fitted, note = resolve_pool_fill(
        cfg, good_facts(draft_graph_tokens=507, num_speculative_tokens=12))
    assert fitted.draft_pool_fill == 15
    assert "not 16" in note and "507 tokens at K=12" in note
    fits = SpecExtendConfig(draft_prompt_pool=128, draft_pool_fill=8)
    assert resolve_pool_fill(fits, good_facts(draft_graph_tokens=507)) == (fits, None)
    assert resolve_pool_fill(cfg, good_facts(draft_graph_tokens=None)) == (cfg, None)
    no_pool = SpecExtendConfig(draft_prompt_pool=None, draft_pool_fill=16)  # "auto" off
    dropped, note = resolve_pool_fill(no_pool, good_facts(draft_graph_tokens=507))
    assert dropped == dataclasses.replace(no_pool, draft_pool_fill=None)  # no pool
    assert note == "none, not 16: no prompt pool is made on this engine"
    unset = SpecExtendConfig(draft_prompt_pool=128, draft_pool_fill=None)
    assert resolve_pool_fill(unset, good_facts(draft_graph_tokens=16)) == (unset, None)


def test_the_pool_with_a_fill_is_the_default():
    """Since 2026-12-07 (the real pair, H100: copy 30K 1.26x plain against the
    full pass's 1.17-1.18x): ``draft_prompt_pool`` and ``draft_pool_fill``
    ``"auto"``: 128 chunks where the engine pools, 8 a refresh, said at start."""
    cfg = SpecExtendConfig()
    assert (cfg.draft_prompt_pool, cfg.draft_pool_fill) == ("auto", "auto")
    facts = good_facts(**LONG, draft_graph_tokens=507)
    validate_engine(cfg, facts)
    cfg, _ = resolve_prompt_pool(cfg, facts)
    resolved, note = resolve_pool_fill(cfg, facts)
    assert resolved.draft_prompt_pool == 128
    assert resolved.draft_pool_fill == AUTO_POOL_FILL
    assert AUTO_POOL_FILL == 8 and note == "8 chunks a refresh"
    # Within the draft's largest graph, as a named fill is.
    lowered, note = resolve_pool_fill(cfg, good_facts(**LONG, draft_graph_tokens=130))
    assert lowered.draft_pool_fill == 4 and "not 8" in note


@pytest.mark.parametrize("cfg, facts", [
    ({"draft_prompt_pool": None}, {}),  # the full pass named: nothing to grow
    ({"draft_prefill_window": 2048}, {}),  # a window named: the pool steps aside
    ({"policy": "streaming"}, {}),
    ({}, {"method": "eagle3"}),
    ({}, {"max_model_len": 2048, "draft_max_model_len": 2048}),  # too short to pool
])
def test_auto_fill_steps_aside_where_no_pool_is_made(cfg, facts):
    """``"auto"`` never refuses: where the pool resolves to the full pass the
    fill resolves to none, where an explicit fill would be refused."""
    cfg = SpecExtendConfig(**cfg)
    facts = good_facts(**{**LONG, "draft_graph_tokens": 507, **facts})
    validate_engine(cfg, facts)
    cfg, _ = resolve_prompt_pool(cfg, facts)
    resolved, note = resolve_pool_fill(cfg, facts)
    assert resolved.draft_prompt_pool is None
    assert resolved.draft_pool_fill is None and note is None


def test_auto_fill_keeps_within_the_step_budget():
    cfg = SpecExtendConfig(draft_prompt_pool=4, top_k=4, draft_pool_fill="auto")
    resolved, _ = resolve_pool_fill(cfg, good_facts(max_num_batched_tokens=100))
    assert resolved.draft_pool_fill == 3  # 96 of the 100 tokens


def test_a_prompt_pool_applies_past_what_it_holds():
    cfg = SpecExtendConfig(draft_prompt_pool=128)
    validate_engine(cfg, good_facts(max_model_len=65536, draft_max_model_len=65536))
    # Sinks, the pool with a chunk to spare each side, the window.
    assert cfg.pool_min_prompt == 32 + 130 * 32 + 256
    assert SpecExtendConfig(draft_prompt_pool=32).pool_min_prompt == 2048  # min_context
    assert SpecExtendConfig(draft_prompt_pool=None).pool_min_prompt is None
    with pytest.raises(ValueError, match="resolve_prompt_pool"):
        AUTO.pool_min_prompt  # unresolved: a bug, not "never"


@pytest.mark.parametrize("policy, dtype, refused", [
    ("cmr", "fp8", True), ("cmr", "fp8_e5m2", True), ("cmr", "auto", False),
    ("cmr", "bfloat16", False), ("streaming", "fp8", False),
])
def test_fp8_keys_are_refused_where_chunks_are_scored(policy, dtype, refused):
    cfg = SpecExtendConfig(policy=policy, draft_prompt_pool=None)
    facts = good_facts(kv_cache_dtype=dtype)
    if refused:
        match = f"--kv-cache-dtype {dtype} .* use --kv-cache-dtype auto"
        with pytest.raises(SpecExtendConfigError, match=match):
            validate_engine(cfg, facts)
    else:
        validate_engine(cfg, facts)


def test_a_prompt_pool_must_fit_one_draft_forward():
    cfg = SpecExtendConfig(draft_prompt_pool=128)  # up to 32 + 4096 + 256 + 32 + 5
    validate_engine(cfg, good_facts(max_num_batched_tokens=4421, num_speculative_tokens=4))
    with pytest.raises(SpecExtendConfigError, match=r"4421 tokens .* max_num_batched_tokens=4096"):
        validate_engine(cfg, good_facts(max_num_batched_tokens=4096, num_speculative_tokens=4))


# --- draft_prompt_pool "auto" (the default until 2026-12-06, again from 12-07) ---

AUTO = SpecExtendConfig(draft_prompt_pool="auto")

LONG = dict(max_model_len=65536, draft_max_model_len=65536, num_speculative_tokens=4,
            max_num_batched_tokens=8192)
"""An engine that can pool: a 64K draft model at the target's positions, vLLM
serve's 8,192-token budget on an H100 or H200."""


def test_the_full_pass_is_null():
    # The default until 2026-12-07 (with the pool alone the real pair's copy
    # tasks lost a third of the accepted tokens; the fill gives them back).
    full_pass = SpecExtendConfig(draft_prompt_pool=None)
    assert full_pass.pool_min_prompt is None
    assert resolve_prompt_pool(full_pass, good_facts(**LONG)) == (full_pass, None)


def test_auto_pools_twice_top_k():
    assert SpecExtendConfig.from_dict({"draft_prompt_pool": "auto"}) == AUTO
    validate_engine(AUTO, good_facts(**LONG))  # auto never fails
    for top_k, pool in ((64, 128), (16, 32)):
        cfg, note = resolve_prompt_pool(SpecExtendConfig(top_k=top_k, draft_prompt_pool="auto"),
                                        good_facts(**LONG))
        assert cfg.draft_prompt_pool == pool == AUTO_POOL_PER_TOP_K * top_k
        assert note == f"{pool} chunks for prompts from {cfg.pool_min_prompt} tokens"
        validate_engine(cfg, good_facts(**LONG))


@pytest.mark.parametrize("value", [None, 32])
def test_a_named_pool_is_left_as_it_is(value):
    cfg = SpecExtendConfig(draft_prompt_pool=value)
    assert resolve_prompt_pool(cfg, good_facts(**LONG)) == (cfg, None)


@pytest.mark.parametrize("cfg, facts, why", [
    ({}, {"method": "eagle3"}, "the eagle3 head writes no draft KV"),
    ({"self_draft": True}, {"model": "t", "draft_model": "t"}, "self_draft writes no draft KV"),
    ({}, {"draft_max_model_len": 2048}, "compacted"),
    ({"policy": "streaming"}, {}, 'policy "streaming" never ranks'),
    ({"draft_prefill_window": 2048}, {}, "draft_prefill_window both bound"),
    ({}, {"data_parallel_size": 2}, "data parallel ranks"),
    ({}, {"target_position_rows": 3}, "positions have 3 rows (M-RoPE or XD-RoPE)"),
    ({"chunk_size": 16, "sink_tokens": 16}, {"num_speculative_tokens": 16}, "below chunk_size"),
    # vllm serve's budget on GPUs under 70 GiB (or an A100): 2,048 tokens.
    ({}, {"max_num_batched_tokens": 2048}, "max_num_batched_tokens=2048"),
    ({}, {"max_model_len": 4096}, "max_model_len=4096 is below the 4448 tokens"),
])
def test_auto_steps_aside_where_the_engine_cannot_pool(cfg, facts, why):
    """Where a named pool is refused, "auto" is the full pass, and says why
    (not the named key's fix: a user who set nothing has nothing to unset)."""
    cfg, note = resolve_prompt_pool(SpecExtendConfig(**{**cfg, "draft_prompt_pool": "auto"}),
                                    good_facts(**{**LONG, **facts}))
    assert cfg.draft_prompt_pool is None
    assert note.startswith("the draft's full pass over every prompt (") and why in note
    assert "unset" not in note and "Raise" not in note and "Lower" not in note


def test_settings_hold_the_resolved_pool():
    settings = Settings.resolve(AUTO, good_facts(**LONG))
    assert settings.config.draft_prompt_pool == 128
    assert settings.prompt_pool_note.startswith("128 chunks")
    named = Settings.resolve(SpecExtendConfig(draft_prompt_pool=None), good_facts(**LONG))
    assert named.config.draft_prompt_pool is None and named.prompt_pool_note is None


# --- lookup_tokens ------------------------------------------------------------------


def test_lookup_is_auto_by_default_and_never_refused():
    assert SpecExtendConfig().lookup_tokens == "auto"
    validate_engine(SpecExtendConfig(), good_facts(num_speculative_tokens=4,
                                                   draft_sample_method="probabilistic"))


def test_auto_lookup_drafts_three_from_k_8_with_a_draft_model():
    cfg, note = resolve_lookup(SpecExtendConfig(), good_facts(num_speculative_tokens=8))
    assert cfg.lookup_tokens == 5 and note == "5 of 8 tokens a step looked up, 3 drafted"
    cfg, _ = resolve_lookup(SpecExtendConfig(), good_facts(num_speculative_tokens=10))
    assert cfg.lookup_tokens == 7


@pytest.mark.parametrize("facts, why", [
    ({"num_speculative_tokens": 4}, "num_speculative_tokens=4 is below 8"),
    ({"num_speculative_tokens": 7}, "num_speculative_tokens=7 is below 8"),
    ({"num_speculative_tokens": 8, "method": "eagle3"}, "the eagle3 method"),
    ({"num_speculative_tokens": 8, "draft_sample_method": "probabilistic"},
     'draft_sample_method is "probabilistic"'),
    ({"num_speculative_tokens": 8, "data_parallel_size": 2}, "data_parallel_size=2"),
    ({"num_speculative_tokens": 8, "target_position_rows": 3}, "3 rows"),
])
def test_auto_lookup_is_off_where_unmeasured_or_refused(facts, why):
    cfg, note = resolve_lookup(SpecExtendConfig(), good_facts(**facts))
    assert cfg.lookup_tokens == 0
    assert note.startswith("off (") and why in note and "Set " not in note


def test_a_named_lookup_count_is_kept():
    named = SpecExtendConfig(lookup_tokens=2)
    assert resolve_lookup(named, good_facts(num_speculative_tokens=8)) == (named, None)


@pytest.mark.parametrize("value", [-1, True, 2.0, "4", None])
def test_lookup_tokens_must_be_a_count(value):
    with pytest.raises(SpecExtendConfigError, match="lookup_tokens"):
        SpecExtendConfig.from_dict({"lookup_tokens": value})


@pytest.mark.parametrize("k, m", [(8, 5), (7, 4), (2, 1)])
def test_lookup_below_k_is_accepted(k, m):
    validate_engine(SpecExtendConfig(lookup_tokens=m),
                    good_facts(num_speculative_tokens=k))


@pytest.mark.parametrize("k, m", [(4, 4), (4, 6), (1, 1)])
def test_lookup_must_leave_a_draft_forward(k, m):
    with pytest.raises(SpecExtendConfigError,
                       match=rf"lookup_tokens={m} leaves no draft forward .*"
                             rf"Lower lookup_tokens below {k}"):
        validate_engine(SpecExtendConfig(lookup_tokens=m),
                        good_facts(num_speculative_tokens=k))


def test_lookup_refuses_probabilistic_draft_sampling():
    with pytest.raises(SpecExtendConfigError,
                       match='"probabilistic".*Set draft_sample_method to "greedy"'):
        validate_engine(SpecExtendConfig(lookup_tokens=5),
                        good_facts(num_speculative_tokens=8,
                                   draft_sample_method="probabilistic"))


def test_lookup_refuses_multi_row_positions():
    with pytest.raises(SpecExtendConfigError, match="3 rows.*Set lookup_tokens to 0"):
        validate_engine(SpecExtendConfig(lookup_tokens=2),
                        good_facts(num_speculative_tokens=4, target_position_rows=3))


def test_lookup_refuses_data_parallel_ranks():
    # An idle rank's dummy run drafts K while a busy one drafts K - m: their
    # collectives would go out of step.
    with pytest.raises(SpecExtendConfigError, match="data_parallel_size=2.*lookup_tokens to 0"):
        validate_engine(SpecExtendConfig(lookup_tokens=5),
                        good_facts(num_speculative_tokens=8, data_parallel_size=2))
    validate_engine(SpecExtendConfig(lookup_tokens=5), good_facts(num_speculative_tokens=8))


# --- carry_drafts ------------------------------------------------------------------


def test_carry_is_off_by_default_and_resolves_with_the_lookup():
    assert SpecExtendConfig().carry_drafts is None
    settings = Settings.resolve(SpecExtendConfig(carry_drafts=1),
                                good_facts(num_speculative_tokens=12))
    assert settings.config.lookup_tokens == 9 and settings.config.carry_drafts == 1
    Settings.resolve(SpecExtendConfig(lookup_tokens=2, carry_drafts=1),
                     good_facts(num_speculative_tokens=4))


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "1"])
def test_carry_drafts_must_be_a_positive_count(value):
    with pytest.raises(SpecExtendConfigError, match="carry_drafts.*>= 1"):
        SpecExtendConfig.from_dict({"carry_drafts": value})


@pytest.mark.parametrize("cfg, k, match", [
    # "auto" leaves the lookup off below K=8: nothing to carry.
    ({"carry_drafts": 1}, 4, r"lookup is off here .*num_speculative_tokens=4.*"
                             r"Raise --num-speculative-tokens"),
    ({"carry_drafts": 1, "lookup_tokens": 0}, 12, "lookup is off here"),
    # K=12 drafts 3 under "auto": 3 or more is no carry.
    ({"carry_drafts": 3}, 12, r"below the 3 tokens a step drafts.*Lower carry_drafts"),
    ({"carry_drafts": 2, "lookup_tokens": 2}, 4, "below the 2 tokens"),
])
def test_carry_needs_the_lookup_and_fewer_drafts(cfg, k, match):
    with pytest.raises(SpecExtendConfigError, match=match):
        Settings.resolve(SpecExtendConfig(**cfg), good_facts(num_speculative_tokens=k))


def test_carry_is_refused_under_tensor_parallelism():
    # Each rank reads its own copy of the signal: their draft counts could differ.
    with pytest.raises(SpecExtendConfigError,
                       match=r"tensor_parallel_size=2\)\. Drop carry_drafts"):
        Settings.resolve(SpecExtendConfig(carry_drafts=1),
                         good_facts(num_speculative_tokens=12, tensor_parallel_size=2))
