"""The all-reduce + RMSNorm fusion off under --spec-extend at TP where the
host says NVLink multicast is off, and only there."""

from __future__ import annotations

import types

import pytest

from vllm_specextend.compat.allreduce_fusion import fusion_off_without_multicast

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0"}


def _args(tp=2, spec_extend=True, fusion=None, as_dict=False):
    from vllm.config import CompilationConfig

    passes = {} if fusion is None else {"fuse_allreduce_rms": fusion}
    config = ({"pass_config": passes} if as_dict
              else CompilationConfig(pass_config=passes))
    return types.SimpleNamespace(
        additional_config={"spec_extend": {}} if spec_extend else {},
        tensor_parallel_size=tp, compilation_config=config)


def _fusion(args):
    config = args.compilation_config
    if isinstance(config, dict):
        return config["pass_config"].get("fuse_allreduce_rms")
    return config.pass_config.fuse_allreduce_rms


@pytest.mark.parametrize("as_dict", [False, True])
def test_turned_off_at_tp_without_multicast(as_dict):
    args = _args(as_dict=as_dict)
    assert fusion_off_without_multicast(args, NO_MULTICAST)
    assert _fusion(args) is False


@pytest.mark.parametrize("args, environ", [
    (_args(tp=1), NO_MULTICAST),  # no all-reduce to fuse
    (_args(spec_extend=False), NO_MULTICAST),  # not our engine
    (_args(), {}),  # the host did not say multicast is off
    (_args(), {**NO_MULTICAST, "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "trtllm"}),
    (_args(fusion=True), NO_MULTICAST),  # the user asked for it
], ids=["tp1", "no-plugin", "multicast-unknown", "backend-named", "user-on"])
def test_left_alone(args, environ):
    before = _fusion(args)
    assert not fusion_off_without_multicast(args, environ)
    assert _fusion(args) is before
