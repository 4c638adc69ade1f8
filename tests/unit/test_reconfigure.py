"""Proposer.reconfigure: benchmarks switch policies on one engine, but never
past the scratch blocks the engine was started with."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from vllm_specextend.config import SpecExtendConfig, SpecExtendConfigError


def _proposer(compactor=None, method="draft_model", max_model_len=4096):
    from vllm_specextend.config import EngineFacts
    from vllm_specextend.drafting.deferral import PrefillDeferral
    from vllm_specextend.proposer import SpecExtendProposer
    from vllm_specextend.retrieval.retriever import Retriever
    from vllm_specextend.retrieval.staging import HostStaging

    proposer = object.__new__(SpecExtendProposer)  # no engine: only the config logic
    proposer.vllm_config = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_seqs=4)
    )
    proposer.speculative_config = types.SimpleNamespace(num_speculative_tokens=3)
    proposer.device = torch.device("cpu")
    proposer.runner = types.SimpleNamespace(requests={})
    proposer.staging = HostStaging(proposer.device)
    proposer.compactor = compactor
    proposer.deferral = PrefillDeferral()
    proposer.block_size = 32
    proposer.max_model_len = max_model_len
    proposer.settings = types.SimpleNamespace(facts=EngineFacts(
        has_speculative_config=True, method=method, block_size=32,
        tensor_parallel_size=1, pipeline_parallel_size=1, max_model_len=max_model_len,
        num_speculative_tokens=3))
    proposer._min_context = 0
    proposer._num_score_layers = None
    proposer.retriever = Retriever(SpecExtendConfig(), None, proposer.staging,
                                   proposer.device)
    proposer._use_config(SpecExtendConfig())
    slots, _ = proposer.state.slots_for(["r0"])
    proposer.state.put(slots, np.array([64]), np.array([0]))
    proposer.planner.step = 7
    return proposer


def test_reconfigure_switches_policy_and_drops_selections():
    proposer = _proposer()
    proposer.reconfigure(SpecExtendConfig(policy="streaming", top_k=64))
    assert proposer.cfg.policy == "streaming" and proposer.cfg.top_k == 64
    assert proposer.planner.cfg is proposer.cfg is proposer.retriever.cfg
    assert proposer.retriever.state is proposer.state
    assert len(proposer.state) == 0 and proposer.planner.step == 0
    assert proposer.state.selected_chunks.shape[1] == 64


@pytest.mark.parametrize("max_model_len, pool", [(2048, None), (65536, 64)])
def test_reconfigure_resolves_an_auto_pool_for_its_engine(max_model_len, pool):
    """A benchmark's config with draft_prompt_pool "auto" pools where the
    engine can: here 2 x top_k chunks at 64K, not at 2K (no prompt that
    long)."""
    proposer = _proposer(max_model_len=max_model_len)
    proposer.reconfigure(SpecExtendConfig(top_k=32, draft_prompt_pool="auto"))
    assert proposer.cfg.draft_prompt_pool == pool
    assert (proposer.pools is None) == (pool is None)
    assert proposer.planner.pools is proposer.pools is proposer.retriever.pools


def test_reconfigure_refuses_a_fill_without_a_pool_as_the_engine_does():
    proposer = _proposer(max_model_len=65536)
    with pytest.raises(SpecExtendConfigError, match="draft_prompt_pool is null"):
        proposer.reconfigure(SpecExtendConfig(draft_prompt_pool=None, draft_pool_fill=8))
    proposer.reconfigure(SpecExtendConfig(top_k=32))  # the defaults: pool and fill
    assert (proposer.cfg.draft_prompt_pool, proposer.cfg.draft_pool_fill) == (64, 8)


def test_reconfigure_refuses_a_budget_beyond_the_scratch_runs():
    from vllm_specextend.drafting.compactor import Compactor

    compactor = object.__new__(Compactor)
    # sink 32 + top_k 2 * chunk 32 = 3 blocks of 32 per request.
    compactor.first_block, compactor.blocks_per_request = 100, 3
    compactor.cfg = SpecExtendConfig(top_k=2)
    proposer = _proposer(compactor)
    proposer.reconfigure(SpecExtendConfig(top_k=2, policy="streaming"))
    with pytest.raises(SpecExtendConfigError, match="4 scratch blocks"):
        proposer.reconfigure(SpecExtendConfig(top_k=3))
    assert proposer.cfg.top_k == 2, "a refused config leaves the old one"


def test_reconfigure_refuses_another_score_layer():
    # The capture of the scoring layer's queries sits in the target's CUDA
    # graphs: switching layers on a live engine would score stale queries.
    proposer = _proposer()
    with pytest.raises(SpecExtendConfigError, match="score_layer is fixed"):
        proposer.reconfigure(SpecExtendConfig(score_layer=0))
    assert proposer.cfg.score_layer == -1
    proposer.reconfigure(SpecExtendConfig(top_k=8))  # same layer: fine
    # Once the target's 30 layers are known, -1 and 29 name the same one.
    proposer._num_score_layers = 30
    proposer.reconfigure(SpecExtendConfig(score_layer=29))
    proposer.reconfigure(SpecExtendConfig(score_layer=-1))
    with pytest.raises(SpecExtendConfigError, match="score_layer is fixed"):
        proposer.reconfigure(SpecExtendConfig(score_layer=28))
    # Past the layers it is refused, not wrapped around onto the final one.
    with pytest.raises(SpecExtendConfigError, match="outside the target's 30"):
        proposer.reconfigure(SpecExtendConfig(score_layer=59))


def test_reconfigure_refuses_a_prefill_window_the_engine_cannot_serve():
    # A benchmark switching configs on a live engine meets the start-up rules.
    _proposer().reconfigure(SpecExtendConfig(draft_prefill_window=512))
    proposer = _proposer(method="eagle3")
    with pytest.raises(SpecExtendConfigError, match="eagle3 head writes no draft KV"):
        proposer.reconfigure(SpecExtendConfig(draft_prefill_window=512))
    assert proposer.cfg.draft_prefill_window is None


def test_reconfigure_turns_the_lookup_on_and_off_within_k():
    """``lookup_tokens`` below the engine's K (3) builds a history of one row
    per slot and drafts K - m; at K or past it the reconfigure is refused."""
    proposer = _proposer()
    assert proposer.history is None and proposer._drafted(3) == 3
    proposer.reconfigure(SpecExtendConfig(lookup_tokens=2))
    assert proposer.history.tokens.shape == (4, 4096 + 3 + 2)
    assert proposer._drafted(3) == 1 and proposer._drafted(2) == 2
    with pytest.raises(SpecExtendConfigError, match="lookup_tokens=3 leaves no draft"):
        proposer.reconfigure(SpecExtendConfig(lookup_tokens=3))
    proposer.reconfigure(SpecExtendConfig())
    assert proposer.history is None
