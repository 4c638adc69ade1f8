"""The capture manager's pure parts: when a step may replay, how wide the
graph's view is, what the static buffers hold, and the fixed-width view."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_specextend.config import SpecExtendConfig
from vllm_specextend.draft_graph import (
    DraftGraphs,
    DraftInputs,
    blocker,
    graph_view_tokens,
)
from vllm_specextend.view import build_view

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
    cfg = SpecExtendConfig()
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

    def body(batch):
        calls.append(batch)
        return torch.full((batch, K), batch)

    inputs = DraftInputs(max_batch=3, k=K, table_width=4, device=CPU)
    graphs = DraftGraphs(body, [1, 2, 3], inputs, 64, capture=False)
    graphs.capture()
    assert graphs.captured == {1, 2, 3} and calls == []
    assert graphs.run(2).tolist() == [[2] * K] * 2
    assert calls == [2]
    graphs.release()
    assert graphs.captured == set()


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



def test_draft_tuning_is_off_unless_asked_and_never_on_cpu(monkeypatch):
    from vllm_specextend.proposer import DraftTuning

    cuda = torch.device("cuda")
    monkeypatch.delenv("SPECEXTEND_DRAFT_ARGMAX", raising=False)
    monkeypatch.delenv("SPECEXTEND_DRAFT_ATTN_SPLITS", raising=False)
    assert DraftTuning.from_env(cuda) == DraftTuning()
    monkeypatch.setenv("SPECEXTEND_DRAFT_ATTN_SPLITS", "2")
    assert DraftTuning.from_env(cuda).attn_splits == 2
    assert DraftTuning.from_env(CPU) == DraftTuning()


def test_aot_scheduling_is_asked_for_and_excludes_a_split_count(monkeypatch):
    from vllm_specextend.proposer import DraftTuning

    cuda = torch.device("cuda")
    monkeypatch.setenv("SPECEXTEND_DRAFT_AOT", "1")
    monkeypatch.delenv("SPECEXTEND_DRAFT_ATTN_SPLITS", raising=False)
    assert DraftTuning.from_env(cuda).aot_schedule
    assert not DraftTuning.from_env(CPU).aot_schedule
    monkeypatch.setenv("SPECEXTEND_DRAFT_ATTN_SPLITS", "4")
    tuning = DraftTuning.from_env(cuda)
    assert tuning.attn_splits == 4 and not tuning.aot_schedule


def test_scheduled_draft_metadata_keeps_aot_only_where_the_builder_has_it():
    from types import SimpleNamespace

    from vllm_specextend import compat

    class Builder:
        def __init__(self, aot):
            self.aot_schedule, self.calls = aot, []

        def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
            self.calls.append(("build", common_prefix_len, fast_build))
            return ("built", id(self))

        def build_for_drafting(self, common_attn_metadata, draft_index):
            self.calls.append(("drafting", draft_index))
            return ("drafting", id(self))

    fa3, other = Builder(True), Builder(False)
    groups = [SimpleNamespace(get_metadata_builder=lambda b=b: b, layer_names=names)
              for b, names in ((fa3, ["a.0", "a.1"]), (other, ["b.0"]))]
    per_group, per_layer = compat.draft_attn_metadata_scheduled(
        SimpleNamespace(draft_attn_groups=groups), cad=object(), draft_index=2)
    # FA3 builds its full (scheduled) metadata; the other drafts as vLLM does.
    assert fa3.calls == [("build", 0, False)] and other.calls == [("drafting", 2)]
    assert per_group == [("built", id(fa3)), ("drafting", id(other))]
    assert per_layer == {"a.0": per_group[0], "a.1": per_group[0], "b.0": per_group[1]}
