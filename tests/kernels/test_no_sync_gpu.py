"""GPU: the plugin's propose makes no host-device sync, on any kind of step.

Why: under async scheduling the host runs a step ahead of the GPU, and the
engine hands out a step's sampled tokens only once the host has queued the
next step. A sync in the drafter's host path makes the host wait for the
GPU's queue, so every step's output waits a whole step longer: at batch 8
on the real pair the first token of a call came at 0.49-0.52 s against
plain's 0.14 s (docs/evaluation.md, 2026-12-06), and one such sync (a slot's
reset, ``carry.CarrySignal.forget``) cost every request ~20 ms of first
token on an H100. The unit tests check the plugin's parts one by one
(``test_proposer_step.py``, ``test_lookup.py``, ``test_carry.py``); this
runs a whole engine.

An in-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with chunked
prompts side by side (kept passes, cut steps), a pooled prompt that grows, the lookup
with carried steps and the captured routine; the drafter's ``propose`` runs
under ``torch.cuda.set_sync_debug_mode("warn")`` and every warning's Python
stack is kept. A sync whose innermost project frame is the plugin's fails
the test with its stack; syncs from vLLM's own code alone are reported, not
failed (vLLM's drafting loop is not the plugin's to change): a blind spot,
since inputs the plugin hands vLLM could make vLLM's code sync; read the
report. The tiny random target's lookups rarely hold, so the host's carry
answer alternates here (as in ``test_draft_graph_gpu.py``) and every kind
of step is asserted to have run.
"""

from __future__ import annotations

import random
import traceback
import warnings
from collections import Counter

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from test_draft_graph_gpu import CMR, _generate, models  # noqa: E402, F401

CHUNKED = dict(max_num_batched_tokens=1024, long_prefill_token_threshold=256,
               max_num_seqs=8)
PLUGIN = "vllm_specextend"


def _site(stack: list[traceback.FrameSummary]) -> tuple[str, bool, str]:
    """The innermost frame of the plugin's or vLLM's code as ``file:line
    function``, whether it is the plugin's, and the stack's last frames."""
    ours = [f for f in stack if f"/{PLUGIN}/" in f.filename or "/vllm/" in f.filename]
    inner = ours[-1] if ours else stack[-1]
    where = inner.filename.split(f"/{PLUGIN}/")[-1].split("/vllm/")[-1]
    return (f"{where}:{inner.lineno} {inner.name}", f"/{PLUGIN}/" in inner.filename,
            "".join(traceback.format_list(stack[-12:])))


def test_propose_makes_no_sync_in_the_plugin(models, monkeypatch):  # noqa: F811
    from vllm_specextend.drafting.carry import CarrySignal
    from vllm_specextend.proposer import SpecExtendMixin

    answers = iter(int(i % 2) for i in range(10**6))
    monkeypatch.setattr(CarrySignal, "carries", lambda self, slots: bool(next(answers)))

    syncs: Counter = Counter()
    stacks: dict[str, str] = {}
    plugin: set[str] = set()  # sites in the plugin's own code
    propose = SpecExtendMixin.propose

    def audited(self, *args, **kwargs):
        if not torch.cuda.is_current_stream_capturing():
            torch.cuda.set_sync_debug_mode("warn")
        shown = warnings.showwarning

        def keep(message, category, filename, lineno, file=None, line=None):
            if "synchronizing" in str(message):
                site, ours, text = _site(traceback.extract_stack()[:-1])
                syncs[site] += 1
                stacks.setdefault(site, text)
                if ours:
                    plugin.add(site)
            else:
                shown(message, category, filename, lineno, file, line)

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = keep
                return propose(self, *args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(SpecExtendMixin, "propose", audited)
    rng = random.Random(4)
    halves = [[rng.randrange(3, 500) for _ in range(n)] for n in (1500, 600, 1000, 300)]
    prompts = [h + h for h in halves]  # keys recur: the lookup holds at times
    run = _generate(models["target"], "draft_model", models["target"], prompts,
                    {**CMR, "lookup_tokens": 2, "carry_drafts": 1,
                     "draft_pool_fill": 4}, **CHUNKED)

    counts = run["stats"]
    assert run["captured"] and counts["graph_steps"] > 0
    # Every kind of step ran: kept prompt passes (the 600-token prompt: the
    # others pool, from 672 tokens at CMR's top_k), cut steps, pooled
    # passes, their pools grown, carried steps.
    for kind in ("deferred_prefill_passes", "split_prefill_steps",
                 "pooled_prompt_passes", "pool_fills", "carried_steps",
                 "lookup_tokens"):
        assert counts[kind] > 0, (kind, counts)
    report = "\n".join(f"{n} x {site}" for site, n in syncs.most_common())
    print(f"syncs in propose:\n{report or 'none'}")
    assert not plugin, "\n\n".join(f"{site}:\n{stacks[site]}" for site in plugin)
