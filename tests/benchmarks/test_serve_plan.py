"""``benchmarks.bench_serve`` without a server: its datasets, the flags of
each mode, acceptance, and the decode-phase throughput and GPU busy share
from vLLM bench's per-request data."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import bench_serve
from benchmarks.harness.gpu_busy import GpuBusy

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ["long", "shared-doc", "short", "mixed"]


def test_datasets(tiny_target, long_prompts, tmp_path):
    """Every run its own documents, the same in every mode; shared-doc runs
    share one document and differ in the question; no plan touches a server."""
    args = bench_serve.parse_args(
        ["--target", tiny_target, "--modes", "plain", "--input-lens", "256",
         "--mixed-short-len", "64", "--concurrency", "1", "2", "--runs", "2",
         "--out-dir", str(tmp_path)])
    assert args.num_prompts == [2, 4]
    warmups, cells = bench_serve.plan(args)
    assert list(warmups) == [256]
    assert [(c.workload, c.concurrency) for c in cells] == [
        (w, c) for w in WORKLOADS for c in (1, 2)]
    texts = {}
    for cell in cells:
        assert len(cell.datasets) == len(cell.primes) == 2
        for path, prime in zip(cell.datasets, cell.primes, strict=True):
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            assert len(rows) == cell.num_prompts
            assert {r["output_tokens"] for r in rows} == {cell.output_len}
            prompts = [r["prompt"] for r in rows]
            if cell.workload == "shared-doc":
                assert all(p.startswith(prime + "\n\nQuestion ") for p in prompts)
                assert len(set(prompts)) == len(prompts)
                texts[path] = [prime]
            else:
                assert prime is None
                texts[path] = prompts
    documents = [t for ts in texts.values() for t in ts]
    assert len(set(documents)) == len(documents), "no document serves two runs"
    assert not set(documents) & set(warmups.values())


def test_mixed_alternates_short_and_long(tiny_target, tiny_tokenizer, long_prompts,
                                         tmp_path):
    """Requests alternate a short and a long input of their token counts, all
    with the long output length; no prompt starts another (a cache hit)."""
    args = bench_serve.parse_args(
        ["--target", tiny_target, "--modes", "plain", "--workloads", "mixed",
         "--input-lens", "256", "--mixed-short-len", "64", "--concurrency", "2",
         "--num-prompts", "4", "--runs", "2", "--long-output-len", "32",
         "--out-dir", str(tmp_path)])
    _, [cell] = bench_serve.plan(args)
    assert (cell.workload, cell.input_len, cell.short_len, cell.output_len) == (
        "mixed", 256, 64, 32)
    starts = []
    for path, prime in zip(cell.datasets, cell.primes, strict=True):
        assert prime is None
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert [r["output_tokens"] for r in rows] == [32] * 4
        lengths = [len(tiny_tokenizer(r["prompt"], add_special_tokens=False)
                       ["input_ids"]) for r in rows]
        # The server tokenizes the text again: a character the cut split
        # decodes to U+FFFD, 3 byte tokens where there were 1 or 2.
        assert lengths == pytest.approx([64, 256, 64, 256], abs=2)
        starts += [r["prompt"][:100] for r in rows]
    assert len(set(starts)) == len(starts) == 8
    row = bench_serve.cell_row(args, "plain", cell, [])
    assert (row["workload"], row["input_len"], row["short_input_len"]) == (
        "mixed", 256, 64)
    assert bench_serve.inputs(row) == "64- and 256-token inputs"


def test_mixed_needs_a_shorter_short_len(tmp_path):
    """The short inputs must be short at every input length; the other
    workloads ignore the flag and their titles name one length."""
    argv = ["--target", "T", "--modes", "plain", "--input-lens", "1024", "4096",
            "--out-dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        bench_serve.parse_args([*argv, "--workloads", "mixed"])
    args = bench_serve.parse_args([*argv, "--workloads", "long"])
    assert bench_serve.inputs({"input_len": 1024, "short_input_len": None}) == (
        "1024-token inputs")
    assert args.mixed_short_len == 1024


def test_dummy_weights_need_a_tokenizer_that_knows_every_id(tiny_target, tmp_path,
                                                           capsys):
    """A stand-in tokenizer smaller than the model's vocabulary makes the API
    server's detokenizer the bottleneck under dummy weights: refused, with
    the fix named; real weights, or a tokenizer that knows every id, pass."""
    import shutil

    from benchmarks import soak
    from benchmarks.harness.server import loads_dummy_weights
    from benchmarks.models.builders import pad_tokenizer

    assert loads_dummy_weights(["--load-format", "dummy"])
    assert loads_dummy_weights(["--seed", "0", "--load-format=dummy"])
    assert not loads_dummy_weights(["--load-format", "auto", "dummy"])
    assert not loads_dummy_weights(["--load-format"])

    big = tmp_path / "big"  # the tiny model's shape with a larger vocabulary
    big.mkdir()
    config = json.loads((Path(tiny_target) / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**config, "vocab_size": 600}))
    shutil.copy(Path(tiny_target) / "tokenizer.json", big / "tokenizer.json")
    common = ["--target", str(big), "--out-dir", str(tmp_path)]
    for parse, argv in ((bench_serve.parse_args, [*common, "--modes", "plain"]),
                        (soak.parse_args, [*common, "--draft", str(big)])):
        with pytest.raises(SystemExit):
            parse([*argv, "--", "--load-format", "dummy"])
        err = capsys.readouterr().err
        assert "knows 512 ids, the model" in err and "emits up to 600" in err
        assert f"pad-tokenizer {big} OUT --vocab-size 600" in err
        parse([*argv, "--", "--load-format", "auto"])
    pad_tokenizer(big, big, 600)
    bench_serve.parse_args([*common, "--modes", "plain",
                            "--", "--load-format", "dummy"])


def test_eagle3_method(tmp_path):
    """``--method eagle3``: vLLM's speculation and the plugin's server run the
    head; vLLM's own rows say eagle3, the plugin's keep their mode."""
    args = bench_serve.parse_args(
        ["--target", "T", "--draft", "H", "--method", "eagle3", "--out-dir", "x",
         "--modes", *bench_serve.modes.MODES, "--workloads", "long"])
    for mode in ("draft_model", "spec_extend"):
        flags = bench_serve.serve_args(args, mode)
        spec = json.loads(flags[flags.index("--speculative-config") + 1])
        assert (spec["method"], spec["model"]) == ("eagle3", "H")
    cell = bench_serve.Cell("long", 256, 1, 1, 8, [], [])
    rows = [bench_serve.cell_row(args, m, cell, []) for m in bench_serve.modes.MODES]
    assert [(r["mode"], r["method"], r["draft"]) for r in rows] == [
        ("plain", None, None), ("eagle3", "eagle3", "H"),
        ("spec_extend", "eagle3", "H"), ("self_draft", None, None)]
    assert rows[0]["short_input_len"] is None


def merged_mixed_result(tmp_path) -> dict:
    """A mixed cell's rows from two calls, as merge_results joins them: the
    1B draft's (plain first) and the EAGLE-3 head's."""
    cell = bench_serve.Cell("mixed", 256, 4, 4, 32, [], [], short_len=64)
    stats = {"min": 1.0, "median": 2.0, "max": 3.0, "n": 3}
    result = {"meta": {"vllm": "v", "torch": "t", "date_utc": "d", "git_commit": None,
                       "hardware": {"device": "GPU"},
                       "config": {"target": "t", "draft": "d", "runs": 3,
                                  "acceptance_length": 3.0, "num_spec_tokens": 4,
                                  "datasets": ["pg19"]}},
              "servers": [], "results": []}
    for method, draft, mode_list in (
            ("draft_model", "D", ["spec_extend", "plain", "draft_model"]),
            ("eagle3", "H", ["spec_extend", "draft_model"])):
        args = bench_serve.parse_args(
            ["--target", "T", "--draft", draft, "--method", method,
             "--out-dir", str(tmp_path), "--modes", *mode_list])
        for mode in mode_list:
            result["servers"].append({**bench_serve.names(args, mode), "startup_s": 1,
                                      "async_scheduling": True, "forced_stop": [],
                                      "log_errors": []})
            row = bench_serve.cell_row(args, mode, cell, [])
            result["results"].append({
                **row, **{k: stats for k in ("output_tok_s", "tpot_p50_ms", "tpot_p99_ms")},
                "decode_tok_s": {"min": 4.0, "median": 5.0, "max": 6.0, "n": 3}})
    return result


SERIES = ["plain", "draft_model", "eagle3", "spec_extend", "spec_extend on eagle3"]


def test_server_table_says_what_it_knows_of_each_stop(tmp_path):
    """Clean, forced, and written before the stop (a call cut short): the last
    is "not recorded", never "yes"; a note in the meta is printed."""
    result = merged_mixed_result(tmp_path)
    result["servers"][1]["forced_stop"] = ["processes of group 7 left: SIGKILL"]
    del result["servers"][2]["forced_stop"]
    result["meta"]["note"] = "The plain call was cut short."
    text = bench_serve.table(result)
    stops = [line.rsplit("|", 2)[1].strip()
             for line in text.split("| server |")[1].splitlines()[2:] if line.startswith("|")]
    assert stops[:3] == ["yes", "no", "not recorded"], stops
    assert text.rstrip().endswith("The plain call was cut short.")


def test_table_keeps_the_plugin_on_eagle3_apart(tmp_path):
    """A merged table: a line per mode and method, in table order; a mixed
    table's title names both input lengths."""
    text = bench_serve.table(merged_mixed_result(tmp_path))
    assert "### mixed: 64- and 256-token inputs, 32 output tokens" in text
    lines = [ln.split(" | ")[0][2:] for ln in text.splitlines()
             if ln.startswith("| ") and " | 4 | " in ln]
    assert lines == SERIES
    servers = text.split("| server |")[1]
    assert "| spec_extend on eagle3 | 1 |" in servers and "| eagle3 | 1 |" in servers


def test_a_switched_server_is_a_series_of_its_own():
    """An A/B of a tuning switch merged into one file: the switched rows and
    servers are named by the switch, the default's by the mode alone."""
    row = {"mode": "spec_extend", "method": "draft_model"}
    assert bench_serve.series({**row, "plugin_env": {"SPECEXTEND_DATA_DIR": "/x"}}) == (
        "spec_extend")
    assert bench_serve.series({**row, "plugin_env": {
        "SPECEXTEND_EARLY_OUTPUT_COPY": "1"}}) == (
        "spec_extend (SPECEXTEND_EARLY_OUTPUT_COPY=1)")
    assert bench_serve.series({"mode": "spec_extend", "method": "eagle3", "plugin_env": {
        "SPECEXTEND_DRAFT_AOT": "0"}}) == "spec_extend on eagle3 (SPECEXTEND_DRAFT_AOT=0)"


def test_plot_draws_every_series(tmp_path):
    """eagle3 rows get their line, the plugin on eagle3 its own; a mixed plot's
    title names both lengths."""
    pytest.importorskip("matplotlib")
    from benchmarks import plot_serve

    fig = plot_serve.figure(merged_mixed_result(tmp_path), "mixed", 256)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == SERIES
    assert "64- and 256-token inputs" in fig._suptitle.get_text()
    assert fig.axes[0].get_ylabel() == "decode-phase tokens/s"
    # The left panel plots the decode-phase figure (median 5), not output tok/s (2).
    assert {tuple(c.lines[0].get_ydata()) for c in fig.axes[0].containers} == {(5.0,)}


def test_host_run_parses():
    subprocess.run(["bash", "-n", str(REPO_ROOT / "benchmarks/gpu/host_run.sh")],
                   check=True)


def test_serve_args_per_mode():
    args = bench_serve.parse_args(
        ["--target", "T", "--draft", "D", "--acceptance-length", "3", "--out-dir", "x",
         "--modes", *bench_serve.modes.MODES, "--", "--load-format", "dummy"])
    plain, draft_model, spec_extend, self_draft = (
        bench_serve.serve_args(args, m) for m in bench_serve.modes.MODES)
    assert plain == ["T", "--tokenizer", "T", "--seed", "0", "--load-format", "dummy"]
    spec = json.loads(draft_model[draft_model.index("--speculative-config") + 1])
    assert spec == {"method": "draft_model", "model": "D", "num_speculative_tokens": 4,
                    "rejection_sample_method": "synthetic",
                    "synthetic_acceptance_length": 3.0}
    assert "--spec-extend" not in draft_model
    assert spec_extend[:len(draft_model) - 2] == draft_model[:-2]
    assert spec_extend[-4:] == ["--spec-extend", args.spec_extend,
                                "--load-format", "dummy"]
    self_spec = json.loads(self_draft[self_draft.index("--speculative-config") + 1])
    assert self_spec == {k: v for k, v in spec.items() if k not in ("method", "model")}
    assert json.loads(self_draft[self_draft.index("--spec-extend") + 1]) == {
        **json.loads(args.spec_extend), "self_draft": True}


def test_acceptance_from_counters():
    """Without vLLM bench's spec-decode fields, the server's counters count."""
    delta = {"vllm:spec_decode_num_drafts_total": 10.0,
             "vllm:spec_decode_num_draft_tokens_total": 40.0,
             "vllm:spec_decode_num_accepted_tokens_total": 20.0}
    assert bench_serve.acceptance({}, delta) == (0.5, 3.0)
    bench = {"spec_decode_acceptance_rate": 25.0, "spec_decode_acceptance_length": 2.0}
    assert bench_serve.acceptance(bench, delta) == (0.25, 2.0)
    assert bench_serve.acceptance({}, {}) == (None, None)


def test_decode_phase_from_per_request_data():
    """Two requests: decode intervals [1.5, 3.5] and [3, 4] cover 2.5 s; the
    failed request and the tokens before each first token do not count, nor
    do GPU busy samples outside the intervals (before the first token at 1.5,
    between the failed request's start and its error, after the last token)."""
    bench = {"start_times": [1.0, 2.0, 6.0], "ttfts": [0.5, 1.0, 0.1],
             "itls": [[1.0, 1.0], [0.5, 0.5], []], "output_lens": [3, 3, 0],
             "errors": ["", "", "boom"]}
    busy = GpuBusy()
    busy.samples = [(1.2, [0.0]), (2.0, [0.9]), (3.8, [0.7]), (4.5, [0.0]),
                    (6.1, [0.0])]
    assert bench_serve.decode_phase(bench, busy) == {
        "decode_s": 2.5, "decode_tokens": 4, "decode_tok_s": 4 / 2.5,
        "first_token_spread_s": 1.5, "last_request_decode_s": 1.0,
        "gpu_busy": pytest.approx(0.8), "tokens_per_chunk": 1.0}
    busy.samples = []  # no NVML
    assert bench_serve.decode_phase(bench, busy)["gpu_busy"] is None


def test_tokens_per_chunk_shows_a_server_that_merged_steps():
    """A request whose 9 tokens came in 2 chunks (the server merged steps)
    beside two of one token a chunk: the median says 1; then most requests
    bunched; failed and empty requests never count."""
    bench = {"itls": [[0.1, 0.1], [0.3], [0.1, 0.1, 0.1], [], []],
             "output_lens": [3, 9, 4, 0, 5], "errors": ["", "", "", "", "boom"]}
    assert bench_serve.tokens_per_chunk(bench) == 1.0
    bench["itls"][0] = [0.3]
    assert bench_serve.tokens_per_chunk(bench) == 1.5
    assert bench_serve.tokens_per_chunk(
        {"itls": [[]], "output_lens": [0], "errors": [""]}) is None


def test_async_scheduling_is_the_engine_cores_decision(tmp_path):
    """The API server logs its first view, the engine core the final one (on
    CPU the platform turns async scheduling off after the first line)."""
    log = tmp_path / "serve.log"
    log.write_text("(APIServer) INFO Asynchronous scheduling is enabled.\n"
                   "(EngineCore) INFO Asynchronous scheduling is disabled.\n")
    assert bench_serve.async_scheduling(log) is False
    log.write_text("(APIServer) INFO Asynchronous scheduling is enabled.\n")
    assert bench_serve.async_scheduling(log) is True
    log.write_text("no such line\n")
    assert bench_serve.async_scheduling(log) is None


def _serve_file(root, name, cells, spec_extend=None):
    """A bench_serve result of (mode, concurrency, decode tok/s) cells."""
    from benchmarks.harness.measure import spread

    results = [{"workload": "long", "input_len": 256, "short_input_len": None,
                "output_len": 16, "mode": mode, "method": None if mode == "plain" else
                "draft_model", "draft": None if mode == "plain" else "d",
                "concurrency": c, "decode_tok_s": spread([tok_s] * 3),
                "tpot_p50_ms": spread([1.0] * 3), "tpot_p99_ms": spread([2.0] * 3),
                "runs": [{"decode_tok_s": tok_s, "output_throughput": tok_s}] * 3}
               for mode, c, tok_s in cells]
    meta = {"bench": "serve", "date_utc": name, "vllm": "0.26.0",
            "hardware": {"device": "GPU X"},
            "config": {"target": "t", "draft": "d", "runs": 3, "acceptance_length": 3.0,
                       "modes": sorted({m for m, _, _ in cells}),
                       "spec_extend": spec_extend}}
    path = root / "serve" / name / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"meta": meta, "servers": [], "results": results}))
    return path


def test_summary_plots_join_the_headline_cells(tmp_path):
    """Per device, workload and length: the newest file's cell for each mode
    and concurrency, a variant's never, and only where two concurrencies or
    more were measured."""
    from benchmarks import plot_serve, summarize

    _serve_file(tmp_path, "20260101T0000Z_a", [("plain", 4, 10.0), ("spec_extend", 4, 20.0),
                                               ("plain", 16, 30.0), ("spec_extend", 16, 40.0)])
    _serve_file(tmp_path, "20260102T0000Z_b", [("spec_extend", 16, 50.0)])
    _serve_file(tmp_path, "20260103T0000Z_variant", [("spec_extend", 16, 99.0)],
                spec_extend='{"draft_prefill_window": 2048}')
    rows = summarize.summarize(tmp_path)
    groups = plot_serve.from_summary(rows, tmp_path)
    assert list(groups) == [("GPU X", "long", 256)]
    result = groups[("GPU X", "long", 256)]
    cells = {(r["mode"], r["concurrency"]): r["decode_tok_s"]["median"]
             for r in result["results"]}
    assert cells == {("plain", 4): 10.0, ("spec_extend", 4): 20.0,
                     ("plain", 16): 30.0, ("spec_extend", 16): 50.0}
    assert result["meta"]["files"] == ["serve/20260101T0000Z_a/results.json",
                                       "serve/20260102T0000Z_b/results.json"]
    pytest.importorskip("matplotlib")
    title = plot_serve.figure(result, "long", 256)._suptitle.get_text()
    assert "cells from 2 result files" in title and "/ d," in title


def test_summary_plot_draws_a_line_per_draft(tmp_path):
    """A cell measured with another draft gets a line of its own, not a
    vertical jump on the first draft's line."""
    pytest.importorskip("matplotlib")
    from benchmarks import plot_serve, summarize

    _serve_file(tmp_path, "20260101T0000Z_a", [("plain", 4, 10.0), ("spec_extend", 4, 20.0),
                                               ("plain", 16, 30.0), ("spec_extend", 16, 40.0)])
    other = _serve_file(tmp_path, "20260102T0000Z_small", [("plain", 16, 31.0),
                                                           ("spec_extend", 16, 60.0)])
    data = json.loads(other.read_text())
    for r in data["results"]:
        r["draft"] = r["draft"] and "small"
    other.write_text(json.dumps(data))
    result = plot_serve.from_summary(summarize.summarize(tmp_path), tmp_path)[
        ("GPU X", "long", 256)]
    fig = plot_serve.figure(result, "long", 256)
    lines = {t.get_text(): c.lines[0].get_ydata().tolist()
             for t, c in zip(fig.axes[0].get_legend().get_texts(),
                             fig.axes[0].containers, strict=True)}
    assert lines == {"plain": [10.0, 31.0], "spec_extend, d": [20.0, 40.0],
                     "spec_extend, small": [60.0]}
