"""The benchmarks' and GPU tests' way into the proposer (benchmarks.harness.drafter)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.harness import drafter


def test_an_engine_without_the_plugin_is_named_as_such():
    # vLLM loads its plugins once a process: a process started before the
    # plugin was installed builds engines with vLLM's own drafter.
    class DraftModelProposer:
        pass

    with pytest.raises(RuntimeError, match="vLLM's own DraftModelProposer, not "
                       "SpecExtend's: the plugin did not load in this process"):
        drafter.stats(DraftModelProposer())
    for read in (drafter.graphs_captured, drafter.config, drafter.selections):
        with pytest.raises(RuntimeError, match="install the plugin before the process starts"):
            read(DraftModelProposer())


def test_the_plugins_proposer_is_read():
    from vllm_specextend.proposer import SpecExtendMixin

    proposer = object.__new__(type("Proposer", (SpecExtendMixin,), {}))
    proposer.stats = SimpleNamespace(snapshot=lambda: {"graph_steps": 3})
    proposer.capture = SimpleNamespace(graphs={1: object()})
    assert drafter.stats(proposer) == {"graph_steps": 3}
    assert drafter.graphs_captured(proposer)
