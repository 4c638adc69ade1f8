"""``draft_prefill_window``: the draft's passes over prompt chunks attend to
the sinks and a window before each chunk only (CPU, fp32, in-process engines).

Prompts are computed in chunks of 128 tokens per request and step (as in
``test_prefill_deferral.py``), so most of a prompt's draft passes read through
a window of 256 tokens. Greedy output must stay plain decoding's; the window
must change what the draft proposes (its KV of the prompt is computed from
less), and a window longer than every prompt must change nothing. With
deferral on and off the proposals must be equal: a kept pass keeps its window.
"""

from __future__ import annotations

import pytest
from cpu_engine import make_llm, recorded_run
from test_lossless import CMR
from test_prefill_deferral import CHUNKED, LENGTHS, MAX_TOKENS

pytestmark = pytest.mark.engine

WINDOW = 256


@pytest.fixture(scope="module")
def prompts(long_prompts):
    return long_prompts(LENGTHS)


_RUNS: dict[tuple, dict] = {}


def _run(target, draft, prompts, window, defer=True):
    """One engine's run; the same run asked for again (the windowed run with
    deferral) is read from the first, not run twice."""
    key = (target, draft, tuple(map(tuple, prompts)), window, defer)
    if key not in _RUNS:
        _RUNS[key] = _engine_run(target, draft, prompts, window, defer)
    return _RUNS[key]


def _engine_run(target, draft, prompts, window, defer):
    llm = make_llm(target, draft, {**CMR, "draft_prefill_window": window,
                                   "defer_prefill_draft": defer}, **CHUNKED)
    return recorded_run(llm, prompts, MAX_TOKENS)


@pytest.fixture(scope="module")
def full(tiny_target, tiny_draft, prompts):
    """The draft attending to the whole prompt (the key unset)."""
    return _run(tiny_target, tiny_draft, prompts, None)


def test_windowed_prompt_passes_stay_lossless_and_change_the_drafts(
        tiny_target, tiny_draft, prompts, plain_outputs, full):
    windowed = _run(tiny_target, tiny_draft, prompts, WINDOW)

    assert full["stats"]["prefill_window_rows"] == 0
    assert windowed["stats"]["prefill_window_rows"] > 0
    assert windowed["stats"]["deferred_prefill_passes"] > 0, "kept passes too"
    assert windowed["outputs"] == full["outputs"] == plain_outputs
    # The draft's KV of the prompt is computed from less: it drafts otherwise.
    assert windowed["proposals"] != full["proposals"]


def test_a_window_past_every_prompt_changes_nothing(tiny_target, tiny_draft,
                                                    prompts, full):
    wide = _run(tiny_target, tiny_draft, prompts, max(LENGTHS) + 1)

    assert wide["stats"]["prefill_window_rows"] == 0
    assert wide["proposals"] == full["proposals"]


def test_a_kept_pass_keeps_its_window(tiny_target, tiny_draft, prompts):
    deferred = _run(tiny_target, tiny_draft, prompts, WINDOW, defer=True)
    in_step = _run(tiny_target, tiny_draft, prompts, WINDOW, defer=False)

    assert deferred["stats"]["deferred_prefill_passes"] > 0
    assert in_step["stats"]["deferred_prefill_passes"] == 0
    assert deferred["proposals"] == in_step["proposals"], "the same drafts, step by step"
    assert deferred["outputs"] == in_step["outputs"]


PIECE = 32
"""``SPECEXTEND_PROMPT_PIECE``: pieces of 32 inside the 128-token chunks
(``prompt_split.PIECE_TOKENS`` is 1,024, for prompts of GPU length)."""


def test_pieces_inside_a_chunk_stay_lossless_and_keep_their_cut_when_kept(
        tiny_target, tiny_draft, prompts, plain_outputs, full, monkeypatch):
    # Each chunk's draft pass is cut into pieces of 32 that read the sinks and
    # the 256 tokens before their piece: the draft's KV changes again, the
    # output must not; a kept pass (deferral) cuts as the step would have.
    monkeypatch.setenv("SPECEXTEND_PROMPT_PIECE", str(PIECE))
    deferred = _engine_run(tiny_target, tiny_draft, prompts, WINDOW, defer=True)
    in_step = _engine_run(tiny_target, tiny_draft, prompts, WINDOW, defer=False)

    assert deferred["stats"]["prompt_pieces"] > 0
    assert deferred["stats"]["deferred_prefill_passes"] > 0
    assert deferred["outputs"] == in_step["outputs"] == plain_outputs
    assert deferred["proposals"] == in_step["proposals"], "the same drafts, step by step"
    # The draft reads less than the whole prompt: it drafts otherwise. (Against
    # the chunk's window alone this tiny random draft may draft alike: each
    # chunk's first piece reads that window, its last token too where it
    # samples; the pieces' reads are checked exactly in test_prompt_split.py.)
    assert deferred["proposals"] != full["proposals"]
