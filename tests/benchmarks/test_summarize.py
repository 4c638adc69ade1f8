"""benchmarks/results/summary.json and the headline tables come from the result
files (``python -m benchmarks.summarize``), never from a hand edit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import summarize
from benchmarks.harness import meta

RESULTS_README = summarize.RESULTS / "README.md"


def test_committed_summary_is_a_fresh_generation():
    assert summarize.SUMMARY.read_text() == summarize.dumps(summarize.summarize()), (
        "benchmarks/results/summary.json is stale or edited by hand: run "
        "python -m benchmarks.summarize --write benchmarks/results/README.md")


def test_results_readme_table_is_a_fresh_generation():
    rows = json.loads(summarize.SUMMARY.read_text())
    assert summarize.rendered(RESULTS_README, rows) == RESULTS_README.read_text()


def _decode(date, rows, acceptance=3.0):
    return {"meta": {"bench": "decode", "date_utc": date, "hardware": {"device": "GPU"},
                     "config": {"acceptance_length": acceptance}},
            "engines": [], "results": rows}


def _runs(tok_key, tok_s, busy):
    """Runs with ``tok_key``; with ``gpu_busy`` where ``busy`` is a list (files
    from before the sampler have no key at all)."""
    if busy is None:
        return [{tok_key: t} for t in tok_s]
    return [{tok_key: t, "gpu_busy": b} for t, b in zip(tok_s, busy, strict=True)]


def _decode_row(mode, tok_s, draft="d", context=32768, batch=1, busy=None):
    return {"mode": mode, "draft": None if mode == "plain" else draft,
            "context": context, "batch": batch,
            "runs": _runs("decode_tok_s", tok_s, busy)}


def _serve(rows):
    return {"meta": {"bench": "serve", "date_utc": "d", "hardware": {"device": "GPU"},
                     "config": {"acceptance_length": 3.0}},
            "servers": [], "results": rows}


def _serve_row(mode, tok_s, busy=None, decode=True):
    """Runs with decode-phase tok/s ``tok_s`` and output tok/s half of it
    (``decode=False``: a file from before the bench measured the decode phase)."""
    runs = _runs("decode_tok_s", tok_s, busy)
    for run in runs:
        run["output_throughput"] = run["decode_tok_s"] / 2
        if not decode:
            del run["decode_tok_s"]
    return {"workload": "long", "input_len": 16384, "mode": mode,
            "draft": None if mode == "plain" else "d", "concurrency": 4,
            "runs": runs + [{"error": "x"}]}


@pytest.fixture
def results(tmp_path, monkeypatch):
    (tmp_path / "decode").mkdir()
    (tmp_path / "archive").mkdir()
    (tmp_path / "serve" / "20261201T0000Z").mkdir(parents=True)
    old = _decode("a", [_decode_row("spec_extend", [50.0, 60.0, 70.0])])
    # Busy shares: all runs, one run without a sample, none (a CPU host).
    new = _decode("b", [_decode_row("plain", [100.0, 90.0, 110.0],
                                    busy=[0.99, 0.98, 1.0]),
                        _decode_row("draft_model", [150.0, 140.0, 160.0],
                                    busy=[0.6, None, 0.7]),
                        _decode_row("spec_extend", [200.0, 180.0, 210.0],
                                    busy=[None, None, None]),
                        {**_decode_row("spec_extend", []), "batch": 8,
                         "skipped": "does not fit"}])
    (tmp_path / "decode" / "20261201T0000Z_x.json").write_text(json.dumps(old))
    (tmp_path / "decode" / "20261202T0000Z_x.json").write_text(json.dumps(new))
    (tmp_path / "decode" / "real.json").write_text(json.dumps(
        _decode("c", [_decode_row("plain", [1.0])], acceptance=0)))
    (tmp_path / "archive" / "20261203T0000Z_x.json").write_text(json.dumps(new))
    (tmp_path / "serve" / "20261201T0000Z" / "results.json").write_text(json.dumps(
        _serve([_serve_row("plain", [10.0, 12.0, 11.0]),
                _serve_row("spec_extend", [15.0, 16.0, 14.0],
                           busy=[0.9, None, 0.8])])))
    (tmp_path / "other.json").write_text(json.dumps({"meta": {}, "rows": []}))
    monkeypatch.setattr(summarize, "RESULTS", tmp_path)
    return tmp_path


def test_rows_carry_every_run(results):
    rows = summarize.summarize(results)
    assert {r["file"] for r in rows} == {
        "decode/20261201T0000Z_x.json", "decode/20261202T0000Z_x.json",
        "decode/real.json", "serve/20261201T0000Z/results.json"}
    new = [r for r in rows if r["file"] == "decode/20261202T0000Z_x.json"]
    assert [(r["mode"], r["tok_s"]) for r in new] == [
        ("plain", [100.0, 90.0, 110.0]), ("draft_model", [150.0, 140.0, 160.0]),
        ("spec_extend", [200.0, 180.0, 210.0])]  # skipped cells left out
    assert new[0] == {"bench": "decode", "device": "GPU", "mode": "plain",
                      "variant": None, "draft": None, "context": 32768, "batch": 1,
                      "tok_s": [100.0, 90.0, 110.0], "gpu_busy": [0.99, 0.98, 1.0],
                      "file": "decode/20261202T0000Z_x.json",
                      "synthetic_acceptance": 3.0, "date_utc": "b"}
    serve = [r for r in rows if r["bench"] == "serve"]
    assert [(r["mode"], r["workload"], r["context"], r["concurrency"], r["tok_s"],
             r["output_tok_s"]) for r in serve] == [
        ("plain", "long", 16384, 4, [10.0, 12.0, 11.0], [5.0, 6.0, 5.5]),
        ("spec_extend", "long", 16384, 4, [15.0, 16.0, 14.0], [7.5, 8.0, 7.0])]


def test_decode_rows_carry_ttft_and_e2e_where_runs_have_them(results):
    """A file of fresh-prompt runs: each run's time to first token and
    end-to-end tok/s beside its decode tok/s, and ``fresh_prompts``; older
    files get none of them (nothing invented), a cached-prompt file says so."""
    fresh = _decode_row("spec_extend", [200.0, 190.0])
    for run, ttft, e2e in zip(fresh["runs"], (2.5, 2.7), (150.0, 140.0), strict=True):
        run.update(ttft_s=ttft, e2e_tok_s=e2e)
    cached = _decode("g", [{**_decode_row("plain", [100.0]), "fresh_prompts": False}])
    cached["results"][0]["runs"][0].update(ttft_s=0.02, e2e_tok_s=99.0)
    (results / "decode" / "20261206T0000Z_fresh.json").write_text(json.dumps(
        _decode("f", [{**fresh, "fresh_prompts": True}])))
    (results / "decode" / "20261207T0000Z_cached.json").write_text(json.dumps(cached))
    rows = {Path(r["file"]).stem: r for r in summarize.summarize(results)
            if r["bench"] == "decode"}
    new = rows["20261206T0000Z_fresh"]
    assert new["tok_s"] == [200.0, 190.0] and new["ttft_s"] == [2.5, 2.7]
    assert new["e2e_tok_s"] == [150.0, 140.0] and new["fresh_prompts"] is True
    assert rows["20261207T0000Z_cached"]["fresh_prompts"] is False
    assert rows["20261207T0000Z_cached"]["ttft_s"] == [0.02]
    for old in ("20261201T0000Z_x", "20261202T0000Z_x", "real"):
        assert not {"e2e_tok_s", "ttft_s", "fresh_prompts"} & set(rows[old])


def test_serve_files_without_decode_figures_keep_output_tok_s(results):
    """Files from before the serving bench measured the decode phase: no
    decode-phase figure (``[]``: not measured), only an output tok/s table."""
    old = results / "serve" / "20261130T0000Z" / "results.json"
    old.parent.mkdir()
    old.write_text(json.dumps(_serve([
        {**_serve_row(mode, [tok_s], decode=False), "input_len": 8192}
        for mode, tok_s in (("plain", 40.0), ("spec_extend", 60.0))])))
    rows = [r for r in summarize.summarize(results) if "20261130" in r["file"]]
    assert [(r["tok_s"], r["output_tok_s"]) for r in rows] == [([], [20.0]),
                                                               ([], [30.0])]
    text = summarize.render(summarize.summarize(results), results / "docs")
    decode_phase, output = text.split("**serve**")[1:]
    assert "| long | 8K |" not in decode_phase
    assert "| long | 8K | d | 4 | [20 (1 run)](" in output


def test_rows_carry_each_runs_gpu_busy(results):
    """One figure per run, None where a run had no sample; [] for files from
    before the sampler; serve runs that failed are left out of both lists."""
    busy = [(Path(r["file"]).stem, r["mode"], r["gpu_busy"])
            for r in summarize.summarize(results)]
    assert busy == [("20261201T0000Z_x", "spec_extend", []),
                    ("20261202T0000Z_x", "plain", [0.99, 0.98, 1.0]),
                    ("20261202T0000Z_x", "draft_model", [0.6, None, 0.7]),
                    ("20261202T0000Z_x", "spec_extend", [None, None, None]),
                    ("real", "plain", []),
                    ("results", "plain", []),
                    ("results", "spec_extend", [0.9, None, 0.8])]


def test_headline_takes_the_newest_file_and_links_it(results):
    text = summarize.render(summarize.summarize(results), results / "docs")
    link = "../decode/20261202T0000Z_x.json"
    # Median busy of the runs with a sample; none without one.
    assert (f"| 32K | – | d | 1 | [100 (90–110) · 99%]({link}) "
            f"| [150 (140–160) · 65%]({link}) | [200 (180–210)]({link}) "
            "| 1.33 | 2.00 |") in text
    assert "real.json" not in text, "real-acceptance runs are no speed runs"
    # Serve: a decode-phase table, then an output tok/s one.
    decode_phase, output = [
        next(ln for ln in part.splitlines() if ln.startswith("| long |"))
        for part in text.split("**serve**")[1:]]
    assert decode_phase.startswith("| long | 16K | d | 4 | [11 (10–12)](")
    assert "[15 (14–16) · 85%](" in decode_phase
    # No draft_model cell to compare with; over plain (same file): 15 / 11.
    assert decode_phase.endswith("| – | 1.36 |"), decode_phase
    assert output.startswith("| long | 16K | d | 4 | [6 (5–6)](")
    assert "[8 (7–8) · 85%](" in output


def test_tuning_variants_stay_out_of_the_headline(results):
    """A newer run with a draft tuning switch set (an A/B) is a row of its own,
    named by the switch, and never replaces the shipped default's cell."""
    ab = _decode("z", [_decode_row("spec_extend", [999.0, 998.0, 997.0])])
    ab["engines"] = [{"mode": "spec_extend", "plugin_env": {
        "SPECEXTEND_DRAFT_ARGMAX": "triton", "SPECEXTEND_DATA_DIR": "/x"}}]
    (results / "decode" / "20261209T0000Z_ab.json").write_text(json.dumps(ab))
    rows = summarize.summarize(results)
    assert [r["variant"] for r in rows if r["file"].endswith("_ab.json")] == [
        "SPECEXTEND_DRAFT_ARGMAX=triton"]
    text = summarize.render(rows, results / "docs")
    assert "999" not in text and "[200 (180–210)]" in text


def test_vllm_kernel_switches_make_a_variant(results):
    """A run whose engines chose other vLLM kernels (fp8 Marlin forced, say)
    is a variant of its file's modes, the baseline's too; the TP hosts'
    standing ``VLLM_ALLREDUCE_USE_SYMM_MEM=0`` is not one."""
    ab = _decode("z", [_decode_row("plain", [11.0]), _decode_row("spec_extend", [999.0])])
    env = {"VLLM_TEST_FORCE_FP8_MARLIN": "1", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    ab["engines"] = [{"mode": m, "plugin_env": {}, "vllm_env": env}
                     for m in ("plain", "spec_extend")]
    (results / "decode" / "20261209T0000Z_marlin.json").write_text(json.dumps(ab))
    rows = summarize.summarize(results)
    assert [r["variant"] for r in rows if r["file"].endswith("_marlin.json")] == [
        "VLLM_TEST_FORCE_FP8_MARLIN=1"] * 2
    assert "999" not in summarize.render(rows, results / "docs")


def test_a_server_across_gpus_names_its_tp_degree():
    """A serving file's servers at TP=4 (``serve_args``) are not a one-GPU
    cell: its device says the degree, as a decode file's does."""
    meta = {"hardware": {"device": "NVIDIA H200"},
            "config": {"serve_args": ["--load-format", "dummy", "--tensor-parallel-size", "4"]}}
    assert summarize.device(meta) == "NVIDIA H200 ×4 (TP=4)"
    assert summarize.device({**meta, "config": {"serve_args": ["--max-model-len", "9"]}}) \
        == "NVIDIA H200"
    for args in (["--tensor-parallel-size=2"], ["--tensor_parallel_size", "2"], ["-tp", "2"]):
        assert summarize.device({**meta, "config": {"serve_args": args}}) \
            == "NVIDIA H200 ×2 (TP=2)"


def test_a_serving_kernel_switch_makes_a_variant(results):
    """A server whose process set a vLLM kernel switch (the row's
    ``vllm_env``, bench_serve's record) is a variant too."""
    ab = _serve([_serve_row("spec_extend", [999.0])])
    ab["results"][0].update(plugin_env={}, vllm_env={"VLLM_TEST_FORCE_FP8_MARLIN": "1"})
    (results / "serve" / "20261209T0000Z_marlin").mkdir(parents=True)
    (results / "serve" / "20261209T0000Z_marlin" / "results.json").write_text(json.dumps(ab))
    rows = summarize.summarize(results)
    assert [r["variant"] for r in rows if "_marlin" in r["file"]] == [
        "VLLM_TEST_FORCE_FP8_MARLIN=1"]


def test_serving_variants_stay_out_of_the_headline(results):
    """A server started with a tuning switch set (an A/B of
    SPECEXTEND_EARLY_OUTPUT_COPY, say) gives variant rows."""
    ab = _serve([_serve_row("spec_extend", [999.0, 998.0, 997.0])])
    ab["meta"]["date_utc"] = "z"
    ab["servers"] = [{"mode": "spec_extend", "plugin_env": {
        "SPECEXTEND_EARLY_OUTPUT_COPY": "1", "SPECEXTEND_DATA_DIR": "/x"}}]
    (results / "serve" / "20261209T0000Z").mkdir()
    (results / "serve" / "20261209T0000Z" / "results.json").write_text(json.dumps(ab))
    rows = summarize.summarize(results)
    assert [r["variant"] for r in rows if "20261209" in r["file"]] == [
        "SPECEXTEND_EARLY_OUTPUT_COPY=1"]
    assert "999" not in summarize.render(rows, results / "docs")


def test_a_merged_serving_ab_keeps_its_default_row(results):
    """One file holding the same mode with and without a switch (two servers
    merged): each row goes by its own server's switches, so the default row
    stays a headline candidate and only the switched one is a variant."""
    default = _serve_row("spec_extend", [777.0, 776.0, 775.0])
    default["plugin_env"] = {"SPECEXTEND_DATA_DIR": "/x"}
    switched = _serve_row("spec_extend", [999.0, 998.0, 997.0])
    switched["plugin_env"] = {"SPECEXTEND_EARLY_OUTPUT_COPY": "1"}
    ab = _serve([default, switched])
    ab["meta"]["date_utc"] = "z"
    ab["servers"] = [{"mode": "spec_extend", "plugin_env": r["plugin_env"]}
                     for r in (default, switched)]
    (results / "serve" / "20261209T0000Z").mkdir()
    (results / "serve" / "20261209T0000Z" / "results.json").write_text(json.dumps(ab))
    rows = summarize.summarize(results)
    assert [r["variant"] for r in rows if "20261209" in r["file"]] == [
        None, "SPECEXTEND_EARLY_OUTPUT_COPY=1"]
    text = summarize.render(rows, results / "docs")
    assert "[776 (775–777)" in text and "999" not in text


def test_caption_explains_busy_only_where_a_cell_shows_it(results):
    rows = summarize.summarize(results)
    # decode, serve's decode phase, serve's output tok/s
    assert summarize.render(rows).count("median GPU busy share") == 3
    old = [r for r in rows if r["file"] == "decode/20261201T0000Z_x.json"]
    text = summarize.render(old)
    assert "GPU busy" not in text and "%" not in text


def test_region_between_the_markers_is_replaced():
    text = f"intro\n{summarize.START}\nold\n{summarize.END}\nrest\n"
    assert summarize.replace_region(text, "new\n") == (
        f"intro\n{summarize.START}\nnew\n{summarize.END}\nrest\n")
    with pytest.raises(ValueError, match="add the two markers"):
        summarize.replace_region("no markers", "new\n", "README.md")


def test_check_fails_on_a_stale_file(results, tmp_path, monkeypatch):
    monkeypatch.setattr(summarize, "SUMMARY", results / "summary.json")
    md = tmp_path / "page.md"
    md.write_text(f"{summarize.START}\n{summarize.END}\n")
    assert summarize.main(["--write", str(md)]) == 0
    assert summarize.main(["--check", str(md)]) == 0
    md.write_text(md.read_text().replace("200 (180–210)", "250 (180–210)"))
    assert summarize.main(["--check", str(md)]) == 1
    assert Path(summarize.SUMMARY).is_file()


def test_ratio_only_within_one_file(results):
    """A newer file with spec_extend alone: its cell is shown, but it is not
    divided by draft_model from another session's file."""
    newer = _decode("e", [_decode_row("spec_extend", [300.0, 310.0, 320.0])])
    (results / "decode" / "20261204T0000Z_x.json").write_text(json.dumps(newer))
    text = summarize.render(summarize.summarize(results), results / "docs")
    row = next(ln for ln in text.splitlines() if ln.startswith("| 32K | – | d | 1 |"))
    assert "[310 (300–320)](../decode/20261204T0000Z_x.json)" in row
    assert "[150 (140–160) · 65%](../decode/20261202T0000Z_x.json)" in row
    assert row.endswith("| – | – |"), row


def test_plain_comes_from_spec_extends_file(results):
    """spec_extend and draft_model from two files that both have plain: the
    plain cell and spec_extend / plain come from spec_extend's file."""
    newer = _decode("e", [_decode_row("plain", [155.0]),
                          _decode_row("spec_extend", [300.0, 310.0, 320.0])])
    (results / "decode" / "20261204T0000Z_x.json").write_text(json.dumps(newer))
    text = summarize.render(summarize.summarize(results), results / "docs")
    row = next(ln for ln in text.splitlines() if ln.startswith("| 32K | – | d | 1 |"))
    assert row.startswith("| 32K | – | d | 1 | [155 (1 run)](../decode/20261204T0000Z_x.json)")
    assert row.endswith("| – | 2.00 |"), row


def test_a_table_per_device_with_its_own_modes(results):
    """Two devices: two tables under the bench's one caption, the device as
    their title; the TP file's table has no draft_model column."""
    tp = _decode("f", [_decode_row("plain", [80.0]),
                       _decode_row("spec_extend", [90.0])])
    tp["meta"]["config"]["tensor_parallel_size"] = 2
    (results / "decode" / "20261205T0000Z_tp.json").write_text(json.dumps(tp))
    text = summarize.render(summarize.summarize(results))
    decode = text.split("**serve**")[0]
    assert decode.count("**decode**") == 1
    one, two = decode.split("*GPU*\n\n")[1].split("*GPU ×2 (TP=2)*\n\n")
    assert one.startswith("| context | prompt | draft | batch | plain | draft_model | ")
    assert two.startswith("| context | prompt | draft | batch | plain | spec_extend | ")
    assert "| 32K | – | d | 1 | 80 (1 run) | 90 (1 run) | – | 1.12 |" in two
    assert "*GPU*\n\n| workload | context |" in text


def test_config_variants_stay_out_of_the_headline(results):
    """A newer run whose plugin config sets more than the speed benches' (a
    ``draft_vocab`` cut, say) gives variant rows named by what it sets, its
    baselines' too: they stay with their A/B, out of the headline."""
    ab = _decode("z", [_decode_row("spec_extend", [999.0, 998.0, 997.0]),
                       _decode_row("draft_model", [555.0, 554.0, 553.0])])
    ab["meta"]["config"]["spec_extend"] = (
        '{"top_k": 32, "recent_tokens": 256, "draft_vocab": 32768}')
    (results / "decode" / "20261209T0000Z_vocab.json").write_text(json.dumps(ab))
    rows = summarize.summarize(results)
    mine = {r["mode"]: r["variant"] for r in rows if r["file"].endswith("_vocab.json")}
    assert mine == {"spec_extend": "draft_vocab=32768", "draft_model": "draft_vocab=32768"}
    text = summarize.render(rows, results / "docs")
    assert "999" not in text and "555" not in text and "[200 (180–210)]" in text


def test_the_speed_config_alone_is_no_variant():
    assert meta.config_switches(json.dumps(meta.SPEED_SPEC_EXTEND)) is None
    assert meta.config_switches(None) is None
    assert meta.config_switches({"top_k": 8, "recent_tokens": 256}) == "top_k=8"


def test_serving_rows_at_a_request_rate(results):
    """bench_serve's rows at a request rate: serve_rate rows with each run's
    output tok/s, TTFT and TPOT p50, goodput and requests in flight; the
    file's burst rows as ever; headline tables of TPOT and TTFT p50 per
    load and rate, the ratio within the file."""
    runs = [{"output_throughput": tok_s, "median_ttft_ms": ttft, "median_tpot_ms": tpot,
             "request_goodput": goodput, "in_flight": flight, "gpu_busy": busy}
            for tok_s, ttft, tpot, goodput, flight, busy in (
                (100.0, 900.0, 40.0, 0.5, 15.0, 0.9),
                (110.0, 800.0, 42.0, 0.4, 17.0, None))]
    rate = {"workload": "long", "input_len": 16384, "mode": "spec_extend", "draft": "d",
            "concurrency": None, "request_rate": 0.5, "load": "high",
            "goodput_slo": {"ttft": 20000.0, "tpot": 50.0},
            "runs": [*runs, {"error": "x"}]}
    before = summarize.render(summarize.summarize(results))
    file = results / "serve" / "20261210T0000Z" / "results.json"
    file.parent.mkdir()
    file.write_text(json.dumps(_serve([rate])))
    text = summarize.render(summarize.summarize(results))
    assert text.startswith(before.rstrip("\n")), "the rate tables come last"
    plain = {**rate, "mode": "plain", "draft": None, "runs": [
        {**runs[0], "median_tpot_ms": 80.0, "median_ttft_ms": 1000.0}]}
    file.write_text(json.dumps(_serve([rate, plain])))
    text = summarize.render(summarize.summarize(results))
    tpot, ttft = text.split("**serve at a request rate**: TPOT")[1].split(
        "**serve at a request rate**: TTFT")
    assert ("| long | 16K | high | – | – | d | 0.5 | 80.0 (1 run) · 90% | "
            "41.0 (40.0–42.0) · 90% | – | 0.51 |") in tpot
    assert ("| long | 16K | high | – | – | d | 0.5 | 1000 (1 run) · 90% | "
            "850 (800–900) · 90% | – | 0.85 |") in ttft
    # Runs whose later requests waited far longer for their first token ran
    # past the server's capacity: their line says the queue grew.
    grew = [{**r, "ttft_growth": 3.0} for r in rate["runs"]]
    plain["runs"] = [{**plain["runs"][0], "ttft_growth": 2.9}]
    file.write_text(json.dumps(_serve([{**rate, "runs": grew}, plain])))
    rows = summarize.summarize(results)
    assert {r["queue"] for r in rows if "20261210" in r["file"]} == {"grew"}
    line = "| long | 16K | high | grew | – | d | 0.5 | 80.0 (1 run)"
    assert line in summarize.render(rows)
    file.write_text(json.dumps(_serve([rate, _serve_row("plain", [10.0, 12.0])])))
    rows = [r for r in summarize.summarize(results) if "20261210" in r["file"]]
    assert [r["bench"] for r in rows] == ["serve_rate", "serve"]
    assert rows[0] == {
        "bench": "serve_rate", "device": "GPU", "mode": "spec_extend", "variant": None,
        "draft": "d", "workload": "long", "context": 16384, "request_rate": 0.5,
        "load": "high", "requests": None,
        "goodput_slo": {"ttft": 20000.0, "tpot": 50.0}, "tok_s": [100.0, 110.0],
        "ttft_p50_ms": [900.0, 800.0],
        "tpot_p50_ms": [40.0, 42.0], "goodput": [0.5, 0.4], "in_flight": [15.0, 17.0],
        "ttft_growth": [None, None], "queue": None, "gpu_busy": [0.9, None], "file": "serve/20261210T0000Z/results.json",
        "synthetic_acceptance": 3.0, "date_utc": "d"}
    assert rows[1]["concurrency"] == 4 and rows[1]["tok_s"] == [10.0, 12.0]


def test_runs_of_fewer_requests_are_a_line_of_their_own(results):
    """A newer file at the same rate and load with 16 requests a run does not
    take the 32-request line's cells: a shorter run is another measurement.
    Each line's ratio divides within its own file."""
    def rate_file(stamp, requests, plain_tpot, spec_tpot):
        rows = [{"workload": "long", "input_len": 32768, "mode": mode,
                 "draft": draft, "concurrency": None, "request_rate": 0.24,
                 "load": "low", "num_prompts": requests,
                 "runs": [{"output_throughput": 100.0, "median_ttft_ms": 1000.0,
                           "median_tpot_ms": tpot}]}
                for mode, draft, tpot in (("plain", None, plain_tpot),
                                          ("spec_extend", "d", spec_tpot))]
        file = results / "serve" / stamp / "results.json"
        file.parent.mkdir()
        file.write_text(json.dumps(_serve(rows)))
    rate_file("20261210T0000Z", 32, 9.6, 6.1)
    rate_file("20261211T0000Z", 16, 8.8, 5.1)
    rows = summarize.summarize(results)
    assert sorted(r["requests"] for r in rows if r["bench"] == "serve_rate") == [
        16, 16, 32, 32]
    tpot = summarize.render(rows).split("**serve at a request rate**: TPOT")[1]
    tpot = tpot.split("**serve at a request rate**: TTFT")[0]
    assert ("| long | 32K | low | – | 16 | d | 0.24 | 8.8 (1 run) | 5.1 (1 run) "
            "| – | 0.58 |") in tpot
    assert ("| long | 32K | low | – | 32 | d | 0.24 | 9.6 (1 run) | 6.1 (1 run) "
            "| – | 0.64 |") in tpot


def test_fresh_and_cached_prompts_are_cells_of_their_own(results):
    """A newer cached-prompt spec_extend file gets a row of its own and never
    fills the fresh comparison's cell; fresh files add an end-to-end table,
    where cached runs (no prefill in them) stay out. An older file that does
    not say which prompts it had gives way to a newer one that says."""
    def timed_row(mode, tok_s, e2e, fresh):
        row = _decode_row(mode, tok_s)
        for run, e in zip(row["runs"], e2e, strict=True):
            run.update(e2e_tok_s=e, ttft_s=1.0)
        return {**row, "fresh_prompts": fresh}
    fresh = _decode("f", [timed_row("plain", [168.0], [141.0], True),
                          timed_row("spec_extend", [255.0], [196.0], True)])
    cached = _decode("g", [timed_row("spec_extend", [270.0], [266.0], False)])
    (results / "decode" / "20261210T0000Z_fresh.json").write_text(json.dumps(fresh))
    (results / "decode" / "20261211T0000Z_cached.json").write_text(json.dumps(cached))
    text = summarize.render(summarize.summarize(results))
    decode, end_to_end = text.split("**serve**")[0].split("**end to end**")
    assert "| 32K | fresh | d | 1 | 168 (1 run) | – | 255 (1 run) | – | 1.52 |" in decode
    assert "| 32K | cached | d | 1 | – | – | 270 (1 run) | – | – |" in decode
    # The older file's spec_extend cell is superseded; its draft_model cell,
    # which no newer file has, stays, and with it its file's plain.
    assert ("| 32K | – | d | 1 | 100 (90–110) · 99% | 150 (140–160) · 65% | – | – | – |"
            in decode)
    assert "| 32K | fresh | d | 1 | 141 (1 run) | 196 (1 run) | – | 1.39 |" in end_to_end
    assert "cached" not in end_to_end.split("\n", 1)[1]


def test_an_older_files_plain_stays_with_its_speculative_cells(results):
    """A newer cached plain row (no draft) at the same context and batch does
    not take the older file's plain away while that file's spec_extend cell
    for another draft is still shown: its ratio divides within the file."""
    old = _decode("h", [_decode_row("plain", [100.0], draft=None),
                        _decode_row("spec_extend", [250.0], draft="e")])
    new = _decode("i", [{**_decode_row("plain", [120.0]), "fresh_prompts": False}])
    (results / "decode" / "20261212T0000Z_old.json").write_text(json.dumps(old))
    (results / "decode" / "20261213T0000Z_new.json").write_text(json.dumps(new))
    rows = [r for r in summarize.summarize(results) if "2026121" in r["file"]]
    decode = summarize.render(rows).split("**end to end**")[0]
    assert "| 32K | – | e | 1 | 100 (1 run) | 250 (1 run) | – | 2.50 |" in decode
