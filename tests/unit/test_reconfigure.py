"""Proposer.reconfigure: benchmarks switch policies on one engine, but never
past the scratch blocks the engine was started with."""

from __future__ import annotations

import pytest

from vllm_specextend.config import SpecExtendConfig, SpecExtendConfigError
from vllm_specextend.scratch import ScratchBlocks
from vllm_specextend.state import RequestSelection, SelectionStore


def _proposer(scratch):
    from vllm_specextend.proposer import SpecExtendProposer

    proposer = object.__new__(SpecExtendProposer)  # no engine: only the config logic
    proposer.cfg = SpecExtendConfig()
    proposer.store = SelectionStore()
    proposer.store.put("r0", RequestSelection(window_start=64))
    proposer.scratch = scratch
    proposer.block_size = 32
    proposer._step = 7
    return proposer


def test_reconfigure_switches_policy_and_drops_selections():
    proposer = _proposer(scratch=None)
    proposer.reconfigure(SpecExtendConfig(policy="streaming", top_k=64))
    assert proposer.cfg.policy == "streaming" and proposer.cfg.top_k == 64
    assert len(proposer.store) == 0 and proposer._step == 0


def test_reconfigure_refuses_a_budget_beyond_the_scratch_runs():
    # sink 32 + top_k 2 * chunk 32 = 3 blocks of 32 per request.
    proposer = _proposer(ScratchBlocks(first_block=100, blocks_per_request=3, num_runs=4))
    proposer.reconfigure(SpecExtendConfig(top_k=2, policy="streaming"))
    with pytest.raises(SpecExtendConfigError, match="4 scratch blocks"):
        proposer.reconfigure(SpecExtendConfig(top_k=3))
    assert proposer.cfg.top_k == 2, "a refused config leaves the old one"
