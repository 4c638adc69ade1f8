"""replicated.py: every way into a replicated draft's forwards runs inside
its one-rank group, and rank 0's drafts are broadcast (no engine; a stand-in
proposer records the TP group each entry saw)."""

from __future__ import annotations

import types

import pytest
import torch

from vllm_specextend import compat
from vllm_specextend.drafting.replicated import ReplicatedDraft

TARGET = types.SimpleNamespace(rank_in_group=0, world_size=2, name="target")
DRAFT = types.SimpleNamespace(rank_in_group=0, world_size=1, name="draft")


class _Proposer:
    """Stands for SpecExtendMixin over vLLM's DraftModelProposer: each entry
    notes which group ``get_tp_group()`` returned while it ran."""

    def __init__(self, replicated: bool):
        self.settings = types.SimpleNamespace(replicated_draft=replicated)
        self.seen: dict[str, str] = {}

    def _note(self, entry: str) -> None:
        from vllm.distributed import get_tp_group

        self.seen[entry] = get_tp_group().name

    def load_model(self, target_model) -> None:
        self._note("load_model")

    def propose(self, *args, **kwargs) -> torch.Tensor:
        self._note("propose")
        self._run_kept_passes()  # nested: the kept passes run first
        return torch.tensor([[5, 6, 7]])

    def dummy_run(self, num_tokens, **kwargs) -> None:
        self._note("dummy_run")

    def capture_graphs(self) -> None:
        self._note("capture_graphs")

    def warm_up_kernels(self) -> None:
        self._note("warm_up_kernels")

    def _run_kept_passes(self) -> None:
        self._note("kept_passes")

    def before_block_copies(self) -> None:  # the worker's call, outside propose
        self._run_kept_passes()


class _Drafter(ReplicatedDraft, _Proposer):
    pass


@pytest.fixture
def groups(monkeypatch):
    from vllm.distributed import parallel_state

    monkeypatch.setattr(parallel_state, "_TP", TARGET)
    monkeypatch.setattr(compat, "one_rank_tp_group", lambda: DRAFT)
    sent = []
    monkeypatch.setattr(compat, "tp_broadcast",
                        lambda t: sent.append((compat.tp_rank_and_size(), t.clone())))
    return sent


@pytest.mark.parametrize("replicated", [True, False])
def test_every_draft_entry_runs_in_the_drafts_group(groups, replicated):
    drafter = _Drafter(replicated)
    drafter.load_model(None)
    drafter.warm_up_kernels()
    drafter.dummy_run(8)
    drafter.capture_graphs()
    drafts = drafter.propose()
    drafter.seen.pop("kept_passes")
    drafter.before_block_copies()

    want = "draft" if replicated else "target"
    assert drafter.seen == dict.fromkeys(
        ["load_model", "warm_up_kernels", "dummy_run", "capture_graphs", "propose",
         "kept_passes"], want)
    assert drafter.draft_placement == ("replicated" if replicated else "sharded")
    assert torch.equal(drafts, torch.tensor([[5, 6, 7]]))
    # Rank 0's drafts go to every rank, over the target's group.
    assert [(who, t.tolist()) for who, t in groups] == (
        [((0, 2), [[5, 6, 7]])] if replicated else [])
    from vllm.distributed import get_tp_group
    assert get_tp_group() is TARGET
