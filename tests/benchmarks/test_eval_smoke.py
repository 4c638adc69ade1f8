"""benchmarks/longinput/eval_longinput.py end to end on the tiny CPU models (fp32).

Every (dataset, length, mode) row is written, acceptance is within bounds, and
greedy outputs of every speculative mode equal plain decoding's.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from benchmarks.longinput import eval_longinput, report

pytestmark = pytest.mark.engine

K = 4
DATASETS = ["pg19", "govreport"]
LENGTHS = [512, 1024]
MODES = ["none", "draft_model", "streaming", "cmr"]
# A small budget (32 sinks + 4 x 32 + 64 recent) so the view applies at 512.
SPEC_EXTEND = '{"top_k": 4, "recent_tokens": 64, "draft_prompt_pool": "auto"}'


def harness(tmp_path, target, draft, *extra) -> dict:
    out = tmp_path / "results.json"
    argv = ["run", "--target", target, "--draft", draft, "--out", str(out),
            "--num-spec-tokens", str(K), "--spec-extend", SPEC_EXTEND,
            "--max-new-tokens", "16", "--ignore-eos", *extra]
    assert eval_longinput.main(argv) == 0
    assert out.with_suffix(".md").is_file()
    return json.loads(out.read_text())


def test_all_tasks_end_to_end(tiny_target, tiny_draft, long_prompts, tmp_path):
    result = harness(
        tmp_path, tiny_target, tiny_draft,
        "--tasks", "eval", "cost", "needle", "--datasets", *DATASETS,
        "--lengths", *map(str, LENGTHS), "--num-prompts", "2", "--batch-size", "2",
        "--needle-lengths", "1024", "--needle-depths", "0.5", "--needle-prompts", "1",
    )
    rows = {(r["dataset"], r["length"], r["mode"]): r
            for r in result["rows"] if r["task"] == "eval"}
    assert set(rows) == set(itertools.product(DATASETS, LENGTHS, MODES))
    for (_, length, mode), row in rows.items():
        assert row["prompt_len"] == length
        assert row["output_tokens"] == 2 * 16
        assert 1.0 <= row["mean_accepted_length"] <= K + 1
        assert row["decode_tok_s"] > 0 and row["e2e_tok_s"] > 0
        if mode != "none":
            assert row["mismatches"] == 0, (length, mode)
            assert row["spec_decode"]["drafts"] > 0
            assert row["draft_steps"] > 0
        stats = row["spec_extend_stats"]
        if mode == "cmr":
            assert stats["retrievals"] > 0 and stats["view_rows"] > 0
            assert stats["draft_context_tokens"] < stats["full_context_tokens"]
        if mode == "streaming":
            assert stats["retrievals"] == 0 and stats["view_rows"] > 0
            assert row["draft_prompt_pool"] is None, "auto: streaming never pools"

    # eval covers the cost runs (same dataset, lengths, modes): no extra rows.
    assert not [r for r in result["rows"] if r["task"] == "cost"]
    needle = [r for r in result["rows"] if r["task"] == "needle"]
    assert sorted(r["mode"] for r in needle) == ["cmr", "draft_model", "streaming"]
    assert all(r["replay_consistent"] for r in needle)
    assert len({r["output_hashes"][0] for r in needle}) == 1  # lossless here too
    # Each SpecExtend row says what the engine's pool became and whether this
    # prompt's draft pass was pooled: cmr pools with "auto" (8 chunks at
    # top_k 4, prompts from 416 tokens), streaming never; vLLM's own
    # draft_model has neither.
    by_mode = {r["mode"]: r for r in needle}
    assert "draft_prompt_pool" not in by_mode["draft_model"]
    assert by_mode["draft_model"]["spec_extend_stats"] is None
    assert by_mode["cmr"]["draft_prompt_pool"] == 8
    assert by_mode["cmr"]["spec_extend_stats"]["pooled_prompt_passes"] == 1
    assert by_mode["cmr"]["spec_extend_stats"]["retrievals"] > 0
    assert by_mode["streaming"]["draft_prompt_pool"] is None
    assert by_mode["streaming"]["spec_extend_stats"]["pooled_prompt_passes"] == 0
    assert result["meta"]["models"]["draft"]["num_hidden_layers"] == 1
    markdown = Path(tmp_path / "results.md").read_text()
    assert "## CMR cost" in markdown and "## Passkey retrieval" in markdown


def test_needle_replay_matches_vllm_counters(tiny_target, long_prompts, tmp_path):
    """The target drafting for itself: nearly every draft is accepted, so
    replaying the recorded proposals against the output must reproduce vLLM's
    own step and acceptance counts. The prompt is prefilled in 4 chunks, and
    the drafter's proposals during the first 3 must be left out."""
    result = harness(
        tmp_path, tiny_target, tiny_target, "--tasks", "needle",
        "--modes", "draft_model", "--max-num-batched-tokens", "256",
        "--needle-lengths", "1024",
        "--needle-depths", "0.3", "0.7", "--needle-prompts", "1",
    )
    rows = result["rows"]
    assert len(rows) == 2
    for row in rows:
        assert row["replay_consistent"]
        assert row["mean_accepted_length"] > 4.0


def test_compacted_modes(tiny_target, tiny_draft, long_prompts, tmp_path):
    """``*_compact`` modes run on their own engine with compact_positions on:
    the draft sees its working set at positions 0..W-1, output stays exact.
    Two working sets on one engine: the compaction scratch, sized when the
    engine starts, must hold the larger (seen failing on the GPU, 2026-11-26)."""
    result = harness(
        tmp_path, tiny_target, tiny_draft, "--datasets", "govreport",
        "--lengths", "1024", "--num-prompts", "2", "--batch-size", "2",
        "--modes", "none", "streaming_compact", "cmr_compact",
        "--working-sets", "256", "512",
    )
    got = sorted((r["mode"], r["working_set"]) for r in result["rows"])
    assert got == [("cmr_compact", 256), ("cmr_compact", 512), ("none", None),
                   ("streaming_compact", 256), ("streaming_compact", 512)]
    rows = {r["mode"]: r for r in result["rows"]}  # the 512-token runs
    for row in result["rows"]:
        if row["mode"] != "none":
            assert row["mismatches"] == 0, (row["mode"], row["working_set"])
    for mode in ("streaming_compact", "cmr_compact"):
        row = rows[mode]
        assert row["config"]["compact_positions"] is True
        assert row["config"]["policy"] == mode.removesuffix("_compact")
        assert row["mismatches"] == 0, mode
        assert row["spec_extend_stats"]["compactions"] > 0, mode
        assert row["draft_prompt_pool"] is None, "auto steps aside for compaction"
    assert rows["cmr_compact"]["spec_extend_stats"]["retrievals"] > 0


def test_coverage_and_intervals(tiny_target, tiny_draft, long_prompts, tmp_path):
    """``--coverage``: CMR refreshed every step holds the chunk the target
    attends to most (the probe scores as the retriever does, on the same
    query), except on a prompt's first decode step, which drafts through the
    selection made from the prompt's last token; a streaming window misses
    part of the attention of a context longer than it (softmax mass is never
    zero). Batch size 1: one interval per run over its prompts. The draft's
    full pass over each prompt: a pooled one (``draft_prompt_pool``
    ``"auto"`` or N, where the engine can pool) keeps selections to its pool, which a chunk outside it
    would count as a miss."""
    cmr_every_step = ('{"top_k": 4, "recent_tokens": 64, "retrieve_every": 1, '
                      '"draft_prompt_pool": null}')
    result = harness(
        tmp_path, tiny_target, tiny_draft, "--datasets", "govreport",
        "--lengths", "1024", "--num-prompts", "3", "--batch-size", "1",
        "--modes", "none", "draft_model", "streaming", "cmr", "--coverage",
        "--spec-extend", cmr_every_step,
    )
    rows = {r["mode"]: r for r in result["rows"]}
    cmr, streaming = rows["cmr"]["coverage"], rows["streaming"]["coverage"]
    assert rows["cmr"]["spec_extend_stats"]["view_rows"] > 0
    assert rows["cmr"]["draft_prompt_pool"] is None  # named null
    assert cmr["row_steps"] == rows["cmr"]["spec_extend_stats"]["decode_rows"]
    misses = round((1.0 - cmr["top_held"]) * cmr["row_steps"])
    assert misses <= 3, cmr  # at most one per prompt
    assert 0.0 < streaming["mass_held"] < 1.0
    assert 0.0 < cmr["mass_held"] < 1.0
    assert rows["none"]["coverage"] is None and rows["draft_model"]["coverage"] is None
    for mode in ("draft_model", "streaming", "cmr"):
        row = rows[mode]
        assert row["mismatches"] == 0, mode
        assert len(row["batch_counters"]) == 3
        lo, hi = row["accepted_length_ci95"]
        assert lo <= row["mean_accepted_length"] <= hi, mode
    assert rows["none"]["accepted_length_ci95"] is None
    markdown = Path(tmp_path / "results.md").read_text()
    assert "top chunk held %" in markdown


def test_needle_screen_runs_later_modes_only_where_the_target_answered(
        tiny_target, long_prompts, tmp_path):
    """A random tiny target finds no key: the first mode runs every case, and
    the later ones none, each case still counted as one the target missed."""
    result = harness(
        tmp_path, tiny_target, tiny_target, "--tasks", "needle",
        "--modes", "draft_model", "streaming", "cmr", "--needle-screen",
        "--needle-lengths", "1024", "--needle-depths", "0.5", "--needle-prompts", "2",
    )
    rows = result["rows"]
    assert len(rows) == 3 * 2
    ran = [r for r in rows if not r.get("screened")]
    screened = [r for r in rows if r.get("screened")]
    assert len({r["mode"] for r in ran}) == 1 and len(ran) == 2
    assert not any(r["target_correct"] for r in rows)
    assert len(screened) == 4 and all(r["answer"] is None and not r["output_hashes"]
                                      for r in screened)
    summary = report.needle_summary(rows)
    assert [s["prompts"] for s in summary] == [2, 2, 2]
    assert all(s["target_accuracy"] == 0 and s["replay_consistent"] for s in summary)
