"""self_draft: engine arguments, validation and the first draft pass's inputs.

The first pass must put each row's bonus token at the position right after its
accepted tokens, write its KV into that position's slot of the row's own
blocks (PAD past max_model_len) and attend to exactly the context before it.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from vllm_specextend.config import (
    EngineFacts,
    SpecExtendConfig,
    SpecExtendConfigError,
    validate_engine,
)
from vllm_specextend.drafting.self_draft import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    TargetAsDraft,
    speculative_config_for,
)


def _args(spec_extend=None, **kw):
    base = dict(model="/m/target", speculative_config=None, spec_method=None,
                spec_model=None, spec_tokens=None,
                additional_config=None if spec_extend is None
                else {"spec_extend": spec_extend})
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_self_draft_becomes_draft_model_with_the_target():
    args = _args({"self_draft": True})
    speculative_config_for(args)
    assert args.speculative_config == {
        "method": "draft_model",
        "model": "/m/target",
        "num_speculative_tokens": DEFAULT_NUM_SPECULATIVE_TOKENS,
    }


def test_self_draft_keeps_k_and_cli_flags():
    args = _args({"self_draft": True}, spec_tokens=2)
    speculative_config_for(args)
    # --spec-tokens stays a flag: vLLM refuses a key given twice.
    assert args.speculative_config == {"method": "draft_model", "model": "/m/target"}
    args = _args({"self_draft": True}, speculative_config={"num_speculative_tokens": 5})
    speculative_config_for(args)
    assert args.speculative_config["num_speculative_tokens"] == 5
    args = _args({"self_draft": True}, spec_model="/m/target")
    speculative_config_for(args)
    assert "model" not in args.speculative_config


@pytest.mark.parametrize("spec_extend", [None, {}, {"self_draft": False}])
def test_without_self_draft_nothing_changes(spec_extend):
    args = _args(spec_extend)
    speculative_config_for(args)
    assert args.speculative_config is None


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(spec_model="/m/draft"), "separate draft model"),
        (dict(speculative_config={"model": "/m/draft"}), "separate draft model"),
        (dict(speculative_config={"method": "eagle3"}), "'eagle3'"),
        (dict(spec_method="ngram"), "'ngram'"),
    ],
)
def test_self_draft_refuses_another_drafter(kw, match):
    with pytest.raises(SpecExtendConfigError, match=match):
        speculative_config_for(_args({"self_draft": True}, **kw))


def _facts(**kw):
    base = dict(has_speculative_config=True, method="draft_model", block_size=16,
                tensor_parallel_size=1, pipeline_parallel_size=1,
                max_model_len=4096, draft_max_model_len=4096,
                num_speculative_tokens=3, model="/m/t", draft_model="/m/t")
    base.update(kw)
    return EngineFacts(**base)


def test_validate_engine_self_draft():
    validate_engine(SpecExtendConfig(self_draft=True), _facts())
    with pytest.raises(SpecExtendConfigError, match="separate draft_model draft"):
        validate_engine(SpecExtendConfig(self_draft=True), _facts(draft_model="/m/d"))
    with pytest.raises(SpecExtendConfigError, match="separate eagle3 draft"):
        validate_engine(SpecExtendConfig(self_draft=True), _facts(method="eagle3"))
    with pytest.raises(SpecExtendConfigError, match="compact_positions"):
        validate_engine(SpecExtendConfig(self_draft=True, compact_positions=True),
                        _facts())
    with pytest.raises(SpecExtendConfigError, match="self_draft"):
        validate_engine(SpecExtendConfig(), _facts(has_speculative_config=False))


def test_self_draft_must_be_a_bool():
    with pytest.raises(SpecExtendConfigError, match="self_draft"):
        SpecExtendConfig.from_dict({"self_draft": "yes"})


def _cad(seq_lens, block_table, upper=None):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    batch = len(seq_lens)
    qsl = torch.arange(0, 4 * batch + 1, 4, dtype=torch.int32)  # 4 tokens a row
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_reqs=batch,
        num_actual_tokens=4 * batch,
        max_query_len=4,
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table,
        slot_mapping=torch.zeros(4 * batch, dtype=torch.int64),
        seq_lens_cpu_upper_bound=upper,
        _seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32),
        positions=torch.zeros(4 * batch, dtype=torch.int64),
    )


def _drafter(max_model_len=100, block_size=8):
    drafter = object.__new__(TargetAsDraft)
    drafter.max_model_len = max_model_len
    drafter.block_size = block_size
    drafter.input_ids = torch.zeros(64, dtype=torch.int32)
    drafter.positions = torch.zeros(64, dtype=torch.int64)
    drafter.arange = torch.arange(65, dtype=torch.int32)
    drafter.token_arange_np = np.arange(65, dtype=np.int32)
    return drafter


def test_first_pass_runs_the_bonus_token_after_the_accepted_ones():
    drafter = _drafter()
    # Width covers max_model_len (13 blocks of 8), as the runner's tables do.
    table = torch.zeros(3, 13, dtype=torch.int32)
    table[:, :4] = torch.tensor([[7, 3, 9, 4], [5, 6, 2, 8], [1, 11, 12, 13]])
    # Row 0: 20 verified, 2 rejected -> bonus at 18. Row 1: 31 verified, none
    # rejected -> 31. Row 2 at max_model_len: its slot is padding.
    cad = _cad([20, 31, 100], table, upper=torch.tensor([23, 34, 100]))
    drafter._self_draft_rejected = torch.tensor([2, 0, 0], dtype=torch.int32)
    next_tokens = torch.tensor([101, 102, 103], dtype=torch.int32)
    n, sample_at, new = drafter.set_inputs_first_pass(
        None, next_tokens, None, None, None, cad, None
    )
    assert n == 3 and sample_at.tolist() == [0, 1, 2]
    assert drafter.input_ids[:3].tolist() == [101, 102, 103]
    assert drafter.positions[:3].tolist() == [18, 31, 99]
    # Slot = block_table[row, pos // 8] * 8 + pos % 8.
    assert new.slot_mapping.tolist() == [9 * 8 + 2, 8 * 8 + 7, -1]
    assert new.seq_lens.tolist() == [19, 32, 101]
    assert new.seq_lens.dtype == torch.int32
    assert new.query_start_loc.tolist() == [0, 1, 2, 3]
    assert new.query_start_loc_cpu.tolist() == [0, 1, 2, 3]
    assert (new.num_actual_tokens, new.max_query_len) == (3, 1)
    assert new.max_seq_len == 100, "capped at max_model_len"
    assert new.seq_lens_cpu_upper_bound.tolist() == [24, 35, 101]
    # Nothing of the verification's per-token layout survives.
    assert new._seq_lens_cpu is None and new.positions is None
    assert new._token_to_req_indices_cache is None
    assert new.block_table_tensor is table, "reads and writes use the real table"


def test_first_pass_without_rejections_uses_the_verified_length():
    drafter = _drafter()
    table = torch.arange(8, dtype=torch.int32).view(2, 4) + 20
    cad = _cad([5, 16], table)
    drafter._self_draft_rejected = None
    _, _, new = drafter.set_inputs_first_pass(
        None, torch.tensor([1, 2], dtype=torch.int32), None, None, None, cad, None
    )
    assert drafter.positions[:2].tolist() == [5, 16]
    assert new.slot_mapping.tolist() == [20 * 8 + 5, 26 * 8 + 0]
    assert new.seq_lens_cpu_upper_bound is None


def test_zero_speculative_tokens_run_no_forward():
    drafter = _drafter()
    drafter.device = torch.device("cpu")
    cad = _cad([5, 6], torch.zeros(2, 4, dtype=torch.int32))
    out = TargetAsDraft.propose(drafter, 0, None, None, None, None, None, cad, None)
    assert out.shape == (2, 0)
