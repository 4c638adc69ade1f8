"""The capture manager's pure parts: when a step may replay, how wide the
graph's view is, what the static buffers hold, and the fixed-width view."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.drafting.draft_graph import (
    DraftGraphs,
    DraftInputs,
    blocker,
    graph_view_tokens,
)
from vllm_specextend.drafting.view import build_view

CPU = torch.device("cpu")
K = 4


def _why(**changes):
    step = dict(batch=3, num_spec_tokens=K, graph_k=K, captured={1, 2, 3},
                num_tokens=3 * (K + 1), max_query_len=K + 1, all_decoding=True,
                longest_view=500, width_tokens=512, greedy=True, table_width=64,
                graph_table_width=64)
    return blocker(**{**step, **changes})


def test_a_uniform_decode_step_that_fits_replays():
    assert _why() is None
    assert _why(longest_view=512) is None


@pytest.mark.parametrize("changes, reason", [
    ({"batch": 4, "num_tokens": 4 * (K + 1)}, "batch size not captured"),
    ({"num_spec_tokens": 2}, "K differs"),
    ({"all_decoding": False}, "not a uniform decode batch"),
    ({"num_tokens": 3 * (K + 1) + 7, "max_query_len": 8}, "not a uniform decode"),
    ({"max_query_len": K}, "not a uniform decode batch"),
    ({"longest_view": 513}, "outgrows the graph's width"),
    ({"greedy": False}, "probabilistic draft sampling"),
    ({"table_width": 65}, "block table width"),
])
def test_each_blocker_names_its_reason(changes, reason):
    assert reason in _why(**changes)


def test_width_covers_the_working_set_and_short_rows():
    cfg = SpecExtendConfig(top_k=32)  # a working set below min_context
    k, bs = 4, 16
    width = graph_view_tokens(cfg.working_set_tokens(k), cfg.min_context,
                              cfg.retrieve_every, k, bs)
    assert width % bs == 0
    # A row without a view grows past min_context until its next refresh.
    assert width >= cfg.min_context + cfg.retrieve_every * (k + 1) + 2 * k + 2
    # With min_context below the working set, the working set sizes it.
    small = graph_view_tokens(cfg.working_set_tokens(k), 0, cfg.retrieve_every, k, bs)
    assert cfg.working_set_tokens(k) < small < width


def test_inputs_load_copies_each_step_into_the_same_buffers():
    inputs = DraftInputs(max_batch=4, k=K, table_width=8, device=CPU)
    addresses = [t.data_ptr() for t in (inputs.token_ids, inputs.block_table)]
    n = 2 * (K + 1)
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    params = torch.tensor([[1, 0], [5, 2], [64, 0], [3, 1]])
    inputs.load(2, torch.arange(n, dtype=torch.int32), torch.arange(n) + 100,
                torch.tensor([7, 8], dtype=torch.int32),
                torch.tensor([0, 2], dtype=torch.int32),
                torch.tensor([900, 40], dtype=torch.int32), table, params)
    assert inputs.token_ids[:n].tolist() == list(range(n))
    assert inputs.positions[:n].tolist() == list(range(100, 100 + n))
    assert inputs.seq_lens[:2].tolist() == [900, 40]
    assert torch.equal(inputs.block_table[:2], table)
    assert torch.equal(inputs.view_params[:, :2], params)
    assert inputs.query_start_loc_cpu[:4].tolist() == [0, 5, 10, 15]
    assert [t.data_ptr() for t in (inputs.token_ids, inputs.block_table)] == addresses


def test_uncaptured_graphs_run_the_body_per_step():
    calls = []

    def body(batch, drafts):
        calls.append((batch, drafts))
        return torch.full((batch, K), batch)

    inputs = DraftInputs(max_batch=3, k=K, table_width=4, device=CPU)
    graphs = DraftGraphs(body, [1, 2, 3], inputs, 64, capture=False)
    graphs.capture()
    assert graphs.captured == {1, 2, 3} and calls == []
    assert graphs.run(2).tolist() == [[2] * K] * 2
    assert calls == [(2, K)], "K drafted by default (no lookup)"
    graphs.release()
    assert graphs.captured == set()


def test_a_routine_per_draft_count_runs_the_count_asked_for():
    """carry_drafts: one routine per batch size and draft count, the usual
    count by default."""
    calls = []

    def body(batch, drafts):
        calls.append((batch, drafts))
        return torch.full((batch, K), drafts)

    inputs = DraftInputs(max_batch=2, k=K, table_width=4, device=CPU)
    graphs = DraftGraphs(body, [1, 2], inputs, 64, capture=False,
                         draft_counts=(3, 1))
    graphs.capture()
    assert graphs.captured == {1, 2}
    assert graphs.run(2).tolist() == [[3] * K] * 2
    assert graphs.run(1, 1).tolist() == [[1] * K]
    assert calls == [(2, 3), (1, 1)]
    with pytest.raises(KeyError):
        graphs.run(1, 2)  # no routine for a count not captured


def test_fixed_width_view_is_the_full_views_prefix():
    rng = np.random.default_rng(0)
    table = torch.from_numpy(rng.permutation(4000)[:3 * 200].reshape(3, 200)
                             .astype(np.int32))
    num_selected = torch.tensor([2, 0, 0])
    window_block = torch.tensor([150, 2, 60])
    chunks = torch.tensor([[10, 40], [0, 0], [0, 0]], dtype=torch.int32)
    full, _ = build_view(table, 2, num_selected, window_block, chunks, 2)
    narrow, logical = build_view(table, 2, num_selected, window_block, chunks, 2,
                                 width=64)
    assert narrow.shape == (3, 64)
    assert torch.equal(narrow, full[:, :64])
    # The window's blocks near the end of a long row stay reachable.
    assert logical[0, 6].item() == 150



def test_draft_tuning_defaults_switches_and_cpu(monkeypatch):
    from vllm_specextend.drafting.argmax_triton import argmax_triton
    from vllm_specextend.drafting.tuning import DraftTuning

    cuda = torch.device("cuda")
    for name in ("DRAFT_ARGMAX", "DRAFT_ATTN_SPLITS", "DRAFT_AOT", "EARLY_OUTPUT_COPY"):
        monkeypatch.delenv(f"SPECEXTEND_{name}", raising=False)
    # The measured defaults: Triton argmax, AOT scheduling, vLLM's splits, the
    # early output copy.
    assert DraftTuning.from_env(cuda) == DraftTuning(
        argmax=argmax_triton, attn_splits=None, aot_schedule=True,
        early_output_copy=True)
    monkeypatch.setenv("SPECEXTEND_DRAFT_ARGMAX", "torch")
    monkeypatch.setenv("SPECEXTEND_DRAFT_AOT", "0")
    monkeypatch.setenv("SPECEXTEND_EARLY_OUTPUT_COPY", "0")
    assert DraftTuning.from_env(cuda) == DraftTuning()
    # A split count of its own turns the AOT schedule off.
    monkeypatch.setenv("SPECEXTEND_DRAFT_AOT", "1")
    monkeypatch.setenv("SPECEXTEND_DRAFT_ATTN_SPLITS", "4")
    tuning = DraftTuning.from_env(cuda)
    assert tuning.attn_splits == 4 and not tuning.aot_schedule
    # The early output copy: on unless turned off.
    assert not tuning.early_output_copy
    monkeypatch.delenv("SPECEXTEND_EARLY_OUTPUT_COPY")
    assert DraftTuning.from_env(cuda).early_output_copy
    # Nothing on CPU, whatever the environment says.
    assert DraftTuning.from_env(CPU) == DraftTuning()


@pytest.mark.parametrize("name, value", [
    ("DRAFT_ARGMAX", "fast"), ("DRAFT_AOT", "yes"), ("DRAFT_ATTN_SPLITS", "0"),
    ("DRAFT_ATTN_SPLITS", "x"), ("EARLY_OUTPUT_COPY", "on")])
def test_draft_tuning_refuses_unknown_values_by_name(monkeypatch, name, value):
    from vllm_specextend.drafting.tuning import DraftTuning

    monkeypatch.setenv(f"SPECEXTEND_{name}", value)
    with pytest.raises(ValueError, match=f"SPECEXTEND_{name}={value!r}"):
        DraftTuning.from_env(torch.device("cuda"))


def test_captured_draft_attention_is_scheduled_for_the_drafts_own_heads(monkeypatch):
    from types import SimpleNamespace

    from vllm.v1.attention.backends import fa_utils

    from vllm_specextend import compat

    calls = []
    monkeypatch.setattr(fa_utils, "get_scheduler_metadata",
                        lambda **kw: calls.append(kw) or "schedule", raising=False)
    # The draft's heads (not the target's, which vLLM's builder would use).
    impl = SimpleNamespace(num_heads=32, num_kv_heads=8, head_size=64,
                           sliding_window=(-1, -1), logits_soft_cap=0,
                           sinks=None, alibi_slopes=None, vllm_flash_attn_version=3)
    layers = {
        "d.0": SimpleNamespace(impl=impl),
        # vLLM's in-kernel scheduling stays: a window, FA2 (no AOT schedule).
        "w.0": SimpleNamespace(impl=SimpleNamespace(**{**vars(impl),
                                                       "sliding_window": (127, 0)})),
        "fa2.0": SimpleNamespace(impl=SimpleNamespace(**{**vars(impl),
                                                         "vllm_flash_attn_version": 2})),
    }
    bf16 = SimpleNamespace(dtype=torch.bfloat16, block_size=16)
    fp8 = SimpleNamespace(dtype=torch.uint8, block_size=16)  # a quantized cache
    groups = [SimpleNamespace(layer_names=[n], kv_cache_spec=spec)
              for n, spec in (("d.0", bf16), ("w.0", bf16), ("fa2.0", bf16),
                              ("d.0", fp8), ("d.0", bf16))]
    proposer = SimpleNamespace(
        draft_attn_groups=groups,
        vllm_config=SimpleNamespace(compilation_config=SimpleNamespace(
            static_forward_context=layers)))
    lens = torch.tensor([100, 7], dtype=torch.int32)
    fa = [SimpleNamespace(scheduler_metadata=None, max_query_len=6, max_seq_len=2096,
                          seq_lens=lens, query_start_loc=lens, max_num_splits=32,
                          causal=True)
          for _ in range(4)]
    other = SimpleNamespace()  # another backend's metadata: left alone
    compat.schedule_draft_attention(proposer, [*fa, other], num_reqs=2)
    assert [m.scheduler_metadata for m in fa] == ["schedule", None, None, None]
    assert not hasattr(other, "scheduler_metadata")
    (kw,) = calls
    assert (kw["num_heads_q"], kw["num_heads_kv"], kw["headdim"]) == (32, 8, 64)
    assert (kw["batch_size"], kw["max_seqlen_q"], kw["max_seqlen_k"]) == (2, 6, 2096)
    assert kw["num_splits"] == 32 and kw["page_size"] == 16 and kw["causal"] is True
    assert kw["cache_seqlens"] is lens and kw["qkv_dtype"] == torch.bfloat16
    # Batch-invariant vLLM plans nothing ahead.
    import vllm.envs as envs
    monkeypatch.setattr(envs, "VLLM_BATCH_INVARIANT", True, raising=False)
    fa[0].scheduler_metadata = None
    compat.schedule_draft_attention(proposer, [*fa, other], num_reqs=2)
    assert fa[0].scheduler_metadata is None and len(calls) == 1


@pytest.mark.parametrize("tp, pp, dp, reason", [
    (2, 1, 1, None),  # tensor parallel is captured, collectives and all
    (4, 1, 1, None),
    (1, 2, 1, "pipeline parallel"),
    (2, 1, 2, "data parallel"),
])
def test_tensor_parallel_engines_capture_the_routine(tp, pp, dp, reason):
    from types import SimpleNamespace

    from vllm_specextend import compat

    config = SimpleNamespace(parallel_config=SimpleNamespace(
        tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp))
    # capture=False (static buffers) asks only about the engine's processes.
    why = compat.draft_graph_blocker(config, [], capture=False)
    assert (why is None) if reason is None else why.startswith(reason)


@pytest.mark.parametrize("model_config, rows", [
    (None, 1),
    ({"uses_mrope": False, "uses_xdrope_dim": 0}, 1),
    ({"uses_mrope": True, "uses_xdrope_dim": 0}, 3),  # Qwen2-VL's kin
    ({"uses_mrope": False, "uses_xdrope_dim": 4}, 4),
])
def test_a_target_with_positions_of_several_rows_drafts_without_the_routine(
        model_config, rows):
    """vLLM hands the drafter an M-RoPE or XD-RoPE target's positions as
    they are ([rows, num_tokens]); the routine's buffers hold one row, so
    such an engine drafts through vLLM's path, and says why."""
    from types import SimpleNamespace

    from vllm_specextend import compat
    from vllm_specextend.compat.engine import position_rows

    config = SimpleNamespace(parallel_config=SimpleNamespace(
        tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1))
    if model_config is not None:
        config.model_config = SimpleNamespace(**model_config)
    assert position_rows(config) == rows
    why = compat.draft_graph_blocker(config, [], capture=False)
    assert (why is None) if rows == 1 else why.startswith(
        f"the target's positions have {rows} rows")


def test_capture_runs_warm_ups_first_then_captures_inside_the_given_context(monkeypatch):
    """Every warm-up runs before the capture context opens (inside vLLM's,
    a custom all-reduce only allocates when not capturing), and every graph
    is captured on the stream the context yields, inside it."""
    from contextlib import contextmanager

    events = []

    @contextmanager
    def context():
        events.append("enter")
        yield "the context's stream"
        events.append("exit")

    class Graph:
        def __init__(self, *_, **__):
            pass

    @contextmanager
    def graph(g, pool=None, stream=None):
        events.append(("capture", stream))
        yield

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    inputs = DraftInputs(2, K, 8, CPU)

    def body(batch, drafts):
        events.append(("body", batch, drafts))
        return torch.zeros(batch, K, dtype=torch.int64)

    graphs = DraftGraphs(body, [1, 2], inputs, 64, capture=True,
                         capture_context=context, draft_counts=(3, 1))
    graphs.capture()
    stream = ("capture", "the context's stream")
    assert events == [("body", 2, 3), ("body", 2, 1), ("body", 1, 3),
                      ("body", 1, 1), "enter",
                      stream, ("body", 2, 3), stream, ("body", 2, 1),
                      stream, ("body", 1, 3), stream, ("body", 1, 1), "exit"]
    assert graphs.captured == {1, 2}
