"""The real-pair summary: rows from per-prompt result files (benchmarks.realpair.summarize)."""

from __future__ import annotations

import json
import re

import pytest

from benchmarks.harness.meta import REPO_ROOT
from benchmarks.realpair import summarize
from benchmarks.realpair.run import PLUGIN_CONFIGS, engine_kwargs, mode_kwargs, mode_parser

KD = summarize.DEFAULTS_RUN[1]  # the K the README's quick start passes


def _record(id_, call, ids, e2e, first, last, batch=1, spec=None, right=True,
            group="copy", context=16384):
    return {"id": id_, "group": group, "kind": "quote_code", "context": context,
            "prompt_tokens": context - 100, "batch": batch, "call": call,
            "output_ids": ids, "output_tokens": len(ids), "answer": "", "right": right,
            "finish_reason": "stop", "e2e_s": e2e, "ttft_s": 0.1,
            "decode_s": last - first, "first_ts": first, "last_ts": last,
            "gpu_busy": 0.9, "spec": spec}


def _both(calls, e2e, firsts, lasts, accepted, draft_tokens=4, batch=1):
    """Prompts a and b, each a spec-decode call: ``accepted`` of
    ``draft_tokens`` drafted in one draft step, per prompt."""
    return [_record(id_, call, ids, e2e, first, last, batch=batch,
                    spec={"drafts": 1, "draft_tokens": draft_tokens,
                          "accepted_tokens": acc})
            for id_, call, ids, first, last, acc in zip(
                "ab", calls, ([1, 2, 3, 4], [5, 6, 7, 8, 9]), firsts, lasts, accepted)]


def _write(folder, mode, k, records):
    meta = {"hardware": {"device": "NVIDIA H200"}, "vllm": "0.26.0",
            "git_commit": "abc", "date_utc": "2026-12-06T00:00:00+00:00"}
    (folder / f"{mode}_k{k}.json").write_text(json.dumps(
        {"meta": meta, "mode": mode, "k": None if mode == "plain" else k,
         "records": records}))


@pytest.fixture
def results(tmp_path):
    run = tmp_path / "20261206T0300Z_h200"
    run.mkdir()
    _write(run, "plain", 4, [
        _record("a", 0, [1, 2, 3, 4], 1.5, 10.0, 11.0),
        _record("b", 1, [5, 6, 7, 8, 9], 1.5, 20.0, 21.0),
        _record("a", 2, [1, 2, 3, 4], 3.0, 30.0, 31.5, batch=2),
        _record("b", 2, [5, 6, 7, 8, 9], 3.0, 30.2, 32.0, batch=2),
    ])
    spec = {"drafts": 2, "draft_tokens": 8, "accepted_tokens": 5}
    _write(run, "spec_extend", KD, [
        _record("a", 0, [1, 2, 3, 4], 1.0, 10.0, 10.5, spec=spec),
        _record("b", 1, [5, 6, 0, 8, 9], 1.0, 20.0, 20.5, spec=spec, right=False),
    ])
    return tmp_path


def test_rows_per_cell_with_ratios_and_equality(results):
    rows = summarize.summary(results)
    by = {(r["mode"], r["batch"]): r for r in rows}
    assert set(by) == {("plain", 1), ("plain", 2), ("spec_extend", 1)}
    plain, spec = by[("plain", 1)], by[("spec_extend", 1)]
    assert plain["acc_len"] == 1.0 and plain["k"] is None
    assert plain["e2e_tok_s"] == 9 / 3.0
    assert plain["decode_tok_s"] == 7 / 2.0
    assert plain["equal_to_plain"] == 2 and plain["differs"] is None
    # 1 + accepted / drafts over the cell's two calls.
    assert spec["acc_len"] == 1 + 10 / 4
    assert spec["e2e_tok_s"] == 9 / 2.0
    assert spec["equal_to_plain"] == 1 and spec["differs"] == {"b": 2}
    assert spec["right"] == 1 and spec["prompts"] == 2
    assert spec["device"] == "NVIDIA H200"
    assert spec["file"].endswith(f"spec_extend_k{KD}.json")


def test_batch_rows_time_a_call_once(results):
    row = {(r["mode"], r["batch"]): r for r in summarize.summary(results)}[("plain", 2)]
    assert row["prompts"] == 2
    assert row["e2e_tok_s"] == 9 / 3.0  # one call of 3 s, not two
    assert row["decode_tok_s"] == 7 / 2.0  # first first-token 30.0 to last token 32.0
    assert row["e2e_min"] == row["e2e_max"] == 3.0


def test_first_difference():
    assert summarize.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert summarize.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert summarize.first_difference([1, 2], [1, 2, 3]) == 2


def test_table_names_ratios_to_plain(results):
    text = summarize.table(summarize.summary(results))
    line = next(x for x in text.splitlines() if "| spec_extend |" in x)
    assert "4.5 (1.50×)" in line


def test_engine_kwargs_per_mode():
    assert engine_kwargs("plain", "T", "D", 4) == {"model": "T", "disable_log_stats": False}
    ngram = engine_kwargs("ngram", "T", "D", 8)["speculative_config"]
    assert ngram == {"method": "ngram", "num_speculative_tokens": 8}
    full = engine_kwargs("spec_extend_full_pass", "T", "D", 4)
    assert full["speculative_config"]["model"] == "D"
    assert full["additional_config"] == {"spec_extend": {"draft_prompt_pool": None,
                                                         "draft_prefill_window": None}}
    assert engine_kwargs("spec_extend", "T", "D", 4)["additional_config"] == {
        "spec_extend": {}}
    for mode, k, m in (("spec_extend_lookup", 8, 5), ("spec_extend_lookup4", 5, 4),
                       ("spec_extend_nolookup", 8, 0)):
        lookup = engine_kwargs(mode, "T", "D", k)
        assert lookup["additional_config"] == {"spec_extend": {"lookup_tokens": m}}
        assert lookup["speculative_config"]["num_speculative_tokens"] == k
    # vLLM's own step budget: a budget given, which the plugin leaves alone.
    old_budget = engine_kwargs("spec_extend_step15k", "T", "D", 12)
    assert old_budget["max_num_batched_tokens"] == 16384
    assert old_budget["additional_config"] == {"spec_extend": {}}
    assert "max_num_batched_tokens" not in engine_kwargs("spec_extend", "T", "D", 12)
    # Room for the decoding rows' speculative tokens: both given, so vLLM
    # schedules 16,704 a step and keeps 1,024 slots for the draft.
    room = engine_kwargs("spec_extend_room320", "T", "D", 20)
    assert (room["max_num_scheduled_tokens"], room["max_num_batched_tokens"]) == (
        16704, 17728)
    assert room["additional_config"] == {"spec_extend": {}}
    with pytest.raises(ValueError, match="needs --spec-extend"):
        engine_kwargs("spec_extend_other", "T", "D", 4)
    with pytest.raises(ValueError, match="unknown mode"):
        engine_kwargs("medusa", "T", "D", 4)


def test_the_fp8_draft_mode_runs_the_drafts_fp8_copy(tmp_path):
    kwargs = engine_kwargs("spec_extend_fp8draft", "T", "D/", 12)
    assert kwargs["speculative_config"]["model"] == "D-fp8"
    assert kwargs["additional_config"] == {"spec_extend": {}}
    draft = tmp_path / "d"
    args = mode_parser("x").parse_args(
        ["--cases", "c", "--target", "T", "--draft", str(draft),
         "--mode", "spec_extend_fp8draft", "--k", "12"])
    with pytest.raises(SystemExit, match=re.escape(f"{draft}-fp8 is missing: python -m "
                                                   "benchmarks.models.builders fp8")):
        mode_kwargs(args)
    args.draft = None
    with pytest.raises(SystemExit, match="spec_extend_fp8draft needs --draft"):
        mode_kwargs(args)
    args.draft = str(draft)
    (tmp_path / "d-fp8").mkdir()
    assert mode_kwargs(args)["speculative_config"]["model"] == f"{draft}-fp8"


def test_headline_and_write(results, tmp_path):
    rows = summarize.summary(results)
    text = summarize.headline(rows)
    line = next(x for x in text.splitlines() if x.startswith("| copies"))
    assert "| 16K | 1 | [1.50×][r1] · GPU busy 0.90 |" in line
    assert f"\n[r1]: benchmarks/results/realpair/20261206T0300Z_h200/spec_extend_k{KD}.json" in text
    assert f"`--num-speculative-tokens {KD}`" in text
    assert f"plugin K={KD} / `draft_model` K=4" in text
    assert "not run" in line  # no vLLM method in this folder
    doc = tmp_path / "README.md"
    doc.write_text(f"a\n{summarize.START}\nold\n{summarize.END}\nb\n")
    summarize.write(doc, text)
    assert doc.read_text().startswith(f"a\n{summarize.START}\nReal weights")
    assert doc.read_text().endswith(f"{summarize.END}\nb\n")


def test_headline_takes_the_mode_run_at_todays_defaults(results, monkeypatch):
    # A folder measured before lookup_tokens' default changed: its
    # spec_extend ran the old default, spec_extend_lookup today's.
    folder = next(p for p in results.iterdir() if p.is_dir())
    _write(folder, "spec_extend_lookup", 8,
           _both((0, 1), 0.5, (10.0, 20.0), (10.2, 20.2), (3, 4)))
    rows = summarize.summary(results)
    assert f"spec_extend_k{KD}.json" in summarize.headline(rows)
    monkeypatch.setitem(summarize.DEFAULTS_AS, folder.name, ("spec_extend_lookup", 8))
    text = summarize.headline(rows)
    assert "spec_extend_lookup_k8.json" in text and f"spec_extend_k{KD}.json" not in text
    line = next(x for x in text.splitlines() if x.startswith("| copies"))
    assert "[3.00×][r1]" in line  # 9 tokens in 1.0 s against plain's 3.0


def test_a_step_profile_beside_the_results_is_not_a_mode(results):
    folder = next(p for p in results.iterdir() if p.is_dir())
    (folder / "profile_spec_extend_k4_copy_16384.json").write_text(
        json.dumps({"mode": "spec_extend", "k": 4, "step": {}}))
    assert {r["mode"] for r in summarize.summary(results)} == {"plain", "spec_extend"}


def _newer_folder_at_k4(results, monkeypatch) -> None:
    """A newer run folder of batch-1 rows whose defaults ran as
    spec_extend_top64 at K=4 (``DEFAULTS_AS``)."""
    new = results / "20261207T0000Z_h200"
    new.mkdir()
    _write(new, "plain", 4, [_record("a", 0, [1, 2, 3, 4], 2.0, 10.0, 11.0),
                             _record("b", 1, [5, 6, 7, 8, 9], 2.0, 20.0, 21.0)])
    _write(new, "spec_extend_top64", 4,
           _both((0, 1), 1.0, (10.0, 20.0), (10.5, 20.5), (3, 4)))
    monkeypatch.setitem(summarize.DEFAULTS_AS, new.name, ("spec_extend_top64", 4))


def test_headline_takes_each_cell_from_the_newest_folder_at_todays_defaults(
        results, monkeypatch):
    # A newer folder ran only batch 1 at today's defaults (as its
    # spec_extend_top64 at K=4); batch 2 ran in an older folder before the change.
    old = next(p for p in results.iterdir() if p.is_dir())
    _write(old, "spec_extend", 4,
           _both((2, 2), 1.5, (30.0, 30.1), (31.0, 31.0), (2, 2), batch=2))
    _newer_folder_at_k4(results, monkeypatch)
    monkeypatch.setitem(summarize.DEFAULTS_AS, old.name, None)
    text = summarize.headline(summarize.summary(results))
    rows = [x for x in text.splitlines() if x.startswith("| copies")]
    assert len(rows) == 1 and "| 16K | 1 | [2.05×][r1]" in rows[0]
    # The cell ran K=4: the header says so, and no lookup.
    assert "`--num-speculative-tokens 4`;" in text and "plugin K=4 /" in text
    assert "20261207T0000Z_h200/spec_extend_top64_k4.json" in text
    tail = next(x for x in text.splitlines() if x.startswith("Not yet measured"))
    assert "batch 2" in tail and "`spec_extend` K=4 before the change: [2.00×]" in tail


def test_headline_keeps_a_cell_beside_vllms_own_over_a_newer_one_without(
        results, monkeypatch):
    """A newer folder that ran the defaults beside plain but none of vLLM's
    own methods (a grid of the plugin's modes) leaves the cell to the older
    folder that ran ``ngram`` beside them: the table compares in one session."""
    old = next(p for p in results.iterdir() if p.is_dir())
    _write(old, "ngram", 8, _both((0, 1), 1.2, (10.0, 20.0), (10.5, 20.5), (1, 1)))
    _newer_folder_at_k4(results, monkeypatch)
    text = summarize.headline(summarize.summary(results))
    row = next(x for x in text.splitlines() if x.startswith("| copies"))
    assert "`ngram` K=8" in row and "20261207T0000Z" not in text
    # A row measured unfairly (a note) is no comparison: the newest again.
    rows = summarize.summary(results)
    for r in rows:
        if r["mode"] == "ngram":
            r["note"] = "drafted from cached answers"
    assert "20261207T0000Z_h200/spec_extend_top64_k4.json" in summarize.headline(rows)
    # Where no folder ran one of vLLM's own beside the defaults: the newest.
    (old / "ngram_k8.json").unlink()
    text = summarize.headline(summarize.summary(results))
    assert "20261207T0000Z_h200/spec_extend_top64_k4.json" in text


def test_headline_names_each_cells_k_where_they_differ(results, monkeypatch):
    # Batch 2 at today's defaults (K=KD) in the fixture's folder; batch 1 from
    # a newer folder whose defaults ran at K=4.
    old = next(p for p in results.iterdir() if p.is_dir())
    _write(old, "spec_extend", KD,
           _both((0, 1), 1.0, (10.0, 20.0), (10.5, 20.5), (3, 4), draft_tokens=8)
           + _both((2, 2), 1.5, (30.0, 30.1), (31.0, 31.0), (2, 2), 8, batch=2))
    _newer_folder_at_k4(results, monkeypatch)
    text = summarize.headline(summarize.summary(results))
    assert "the K each cell names" in text and "plugin / `draft_model` K=4" in text
    rows = [x for x in text.splitlines() if x.startswith("| copies")]
    assert len(rows) == 2
    assert "| 1 | [2.05×][r1] K=4 ·" in rows[0] and f"| 2 | [2.00×][r2] K={KD} ·" in rows[1]


def test_a_row_drafted_from_cached_answers_is_left_out_of_the_best(results,
                                                                   monkeypatch):
    """A vLLM row measured unfairly keeps its figures in summary.json with
    the reason, and the headline names it below the table instead of taking
    it as the best of vLLM's own."""
    folder = "20261206T0300Z_h200"
    spec = {"drafts": 1, "draft_tokens": 8, "accepted_tokens": 8}
    _write(results / folder, "suffix", 8, [
        _record("a", 0, [1, 2, 3, 4], 0.5, 10.0, 10.2, spec=spec),
        _record("b", 1, [5, 6, 7, 8, 9], 0.5, 20.0, 20.2, spec=spec)])
    vllm = next(r for r in summarize.summary(results) if r["mode"] == "suffix")
    key = (folder, vllm["mode"], vllm["task"], vllm["context"], vllm["batch"])
    monkeypatch.setattr(summarize, "DRAFTED_FROM_ANSWERS", {key: "it read its answers"})
    rows = summarize.summary(results)
    noted = [r for r in rows if r.get("note")]
    assert [(r["mode"], r["note"]) for r in noted] == [(vllm["mode"], "it read its answers")]
    text = summarize.headline(rows)
    assert f"`{vllm['mode']}` K={vllm['k']} [" not in text.split("Left out")[0]
    assert "Left out of the best of vLLM's own" in text and "it read its answers" in text
    assert "(drafted from cached answers)" in summarize.table(rows)


@pytest.mark.parametrize("mode", sorted(PLUGIN_CONFIGS))
def test_every_plugin_mode_is_a_config_the_real_pair_engine_takes(mode):
    """A mode's keys parse and pass the engine checks on the real pair's
    engine (a draft model at the target's positions, K=12, an H100's step
    budget): a typo or a refused pairing fails here, not on a device host."""
    from vllm_specextend.config import EngineFacts, SpecExtendConfig
    from vllm_specextend.serving.settings import Settings

    facts = EngineFacts(
        has_speculative_config=True, method="draft_model", block_size=16,
        tensor_parallel_size=1, pipeline_parallel_size=1, max_model_len=32768,
        draft_max_model_len=32768, num_speculative_tokens=12, model="T",
        draft_model="D", num_target_attention_layers=28,
        max_num_batched_tokens=16384 + 256, draft_graph_tokens=507)
    cfg = SpecExtendConfig.from_dict(PLUGIN_CONFIGS[mode])
    settings = Settings.resolve(cfg, facts)
    resolved = settings.config
    if resolved.draft_pool_fill is not None:  # a fill needs a pool to grow
        assert resolved.draft_prompt_pool is not None
        assert resolved.draft_pool_fill * cfg.chunk_size <= 507
    if cfg.draft_prefill_window not in (None, "auto"):  # a named window: no pool
        assert resolved.draft_prompt_pool is None and resolved.draft_pool_fill is None


def test_a_cell_may_name_its_first_cases_only():
    """``group:context:batch:count``: a CPU probe's few prompts of a cell."""
    from types import SimpleNamespace

    from benchmarks.realpair.run import select

    cases = [SimpleNamespace(group=g, context=c, id=i)
             for i, (g, c) in enumerate([("copy", 16384)] * 3 + [("other", 16384)])]
    (cell, batch, picked), = select(cases, ["copy:16384:1:2"])
    assert (cell, batch, [c.id for c in picked]) == ("copy:16384:1:2", 1, [0, 1])
    assert [c.id for c in select(cases, ["copy:16384:8"])[0][2]] == [0, 1, 2]
    with pytest.raises(SystemExit, match="matches no case"):
        select(cases, ["copy:8192:1:2"])


def test_the_quick_starts_k_is_the_one_the_headline_reads_as_defaults():
    """The README's and usage's quick start pass the K whose runs the
    headline takes as today's defaults (``DEFAULTS_RUN``): a K changed in one
    place only would put another K's rows under "today's defaults". The
    first command of each is the quick start (the CPU demo's comes later)."""
    for doc in ("README.md", "docs/usage.md"):
        text = (REPO_ROOT / doc).read_text()
        first = re.search(r"--num-speculative-tokens (\d+)[ \\\n]+--spec-extend", text)
        assert first and first.group(1) == str(KD), (doc, first)
