"""``benchmarks.serve.bench_serve`` without a server: its datasets, the flags of
each mode, acceptance, and the decode-phase throughput and GPU busy share
from vLLM bench's per-request data."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.harness.gpu_busy import GpuBusy
from benchmarks.serve import bench_serve
from benchmarks.serve.series import inputs, series

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
    assert inputs(row) == "64- and 256-token inputs"


def test_mixed_needs_a_shorter_short_len(tmp_path):
    """The short inputs must be short at every input length; the other
    workloads ignore the flag and their titles name one length."""
    argv = ["--target", "T", "--modes", "plain", "--input-lens", "1024", "4096",
            "--out-dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        bench_serve.parse_args([*argv, "--workloads", "mixed"])
    args = bench_serve.parse_args([*argv, "--workloads", "long"])
    assert inputs({"input_len": 1024, "short_input_len": None}) == (
        "1024-token inputs")
    assert args.mixed_short_len == 1024


def test_dummy_weights_need_a_tokenizer_that_knows_every_id(tiny_target, tmp_path,
                                                           capsys):
    """A stand-in tokenizer smaller than the model's vocabulary makes the API
    server's detokenizer the bottleneck under dummy weights: refused, with
    the fix named; real weights, or a tokenizer that knows every id, pass."""
    import shutil

    from benchmarks.harness.server import loads_dummy_weights
    from benchmarks.models.builders import pad_tokenizer
    from benchmarks.serve import soak

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
    # Under --jit-monitor-verbose a kernel compiled twice is logged twice.
    result["servers"][0]["jit_after_start"] = ["_block_lse_kernel", "x_kernel",
                                               "_block_lse_kernel"]
    result["servers"][1]["jit_after_start"] = []
    text = bench_serve.table(result)
    rows = [[cell.strip() for cell in line.split("|")[1:-1]]
            for line in text.split("| server |")[1].splitlines()[2:] if line.startswith("|")]
    assert [r[3] for r in rows[:3]] == ["yes", "no", "not recorded"], rows
    # The kernels compiled after start-up; none read from an older file.
    assert [r[4] for r in rows[:3]] == ["_block_lse_kernel ×2, x_kernel", "none",
                                        "not recorded"], rows
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
    assert series({**row, "plugin_env": {"SPECEXTEND_DATA_DIR": "/x"}}) == (
        "spec_extend")
    assert series({**row, "plugin_env": {
        "SPECEXTEND_EARLY_OUTPUT_COPY": "1"}}) == (
        "spec_extend (SPECEXTEND_EARLY_OUTPUT_COPY=1)")
    assert series({"mode": "spec_extend", "method": "eagle3", "plugin_env": {
        "SPECEXTEND_DRAFT_AOT": "0"}}) == "spec_extend on eagle3 (SPECEXTEND_DRAFT_AOT=0)"


def test_plot_draws_every_series(tmp_path):
    """eagle3 rows get their line, the plugin on eagle3 its own; a mixed plot's
    title names both lengths."""
    pytest.importorskip("matplotlib")
    from benchmarks.serve import plot_serve

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


def test_the_servers_pool_is_read_from_its_workers_line(tmp_path):
    """draft_prompt_pool "auto" as the engine resolved it: the worker logs the
    config it runs (a server's log holds its workers' lines)."""
    log = tmp_path / "serve.log"
    line = ("(Worker pid=1) INFO [proposer.py:126] SpecExtend enabled: "
            "SpecExtendConfig(policy='cmr', top_k=32, draft_prefill_window=None, "
            "draft_prompt_pool={}, draft_placement='sharded')\n")
    log.write_text(line.format(128))
    assert bench_serve.resolved_prompt_pool(log) == 128
    log.write_text(line.format("None"))
    assert bench_serve.resolved_prompt_pool(log) is None
    log.write_text("no plugin here\n")
    assert bench_serve.resolved_prompt_pool(log) is None


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
    from benchmarks import summarize
    from benchmarks.serve import plot_serve

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
    from benchmarks import summarize
    from benchmarks.serve import plot_serve

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


# --------------------------------------------------------------------------- #
# request rates (issue #45)
# --------------------------------------------------------------------------- #
DATA = Path(__file__).parent / "data"
RATE_ARGS = ["--target", "T", "--modes", "plain", "--workloads", "long",
             "--request-rates", "0.5", "2", "--load", "low", "high",
             "--goodput", "ttft:20000", "tpot:50", "--num-prompts", "8"]


def saved_rate_result() -> dict:
    """A ``vllm bench serve --save-result --save-detailed`` file at 2 req/s
    with ``--goodput ttft:500 tpot:100`` and ``--metric-percentiles 50,90,99``:
    vLLM 0.26's keys, its figures from vLLM's own ``calculate_metrics``; three
    requests completed 4 tokens each over [100, 100.6], [100.5, 101.3] and
    [101, 102.2] s; the fourth failed."""
    return json.loads((DATA / "vllm_bench_serve_rate.json").read_text())


def test_rate_options_and_their_defaults(tmp_path):
    args = bench_serve.parse_args([*RATE_ARGS, "--out-dir", str(tmp_path)])
    assert (args.concurrency, args.num_prompts, args.load) == (None, [8, 8],
                                                               ["low", "high"])
    assert bench_serve.traffics(args) == [
        bench_serve.Traffic(None, 8, 0.5, "low"),
        bench_serve.Traffic(None, 8, 2.0, "high")]
    assert bench_serve.goodput_slo(args) == {"ttft": 20000.0, "tpot": 50.0}
    args = bench_serve.parse_args(["--target", "T", "--modes", "plain",
                                   "--request-rates", "1", "3", "--out-dir", "x"])
    assert (args.num_prompts, args.load, bench_serve.goodput_slo(args)) == (
        [32, 32], [None, None], None)
    # Bursts as before.
    args = bench_serve.parse_args(["--target", "T", "--modes", "plain",
                                   "--out-dir", "x"])
    assert (args.concurrency, args.num_prompts, args.load) == ([1, 4, 16, 32],
                                                               [2, 8, 32, 64], None)
    assert [t.tag for t in bench_serve.traffics(args)] == ["c1", "c4", "c16", "c32"]


@pytest.mark.parametrize("extra", [
    ["--request-rates", "1", "--concurrency", "4"],
    ["--load", "high"],
    ["--request-rates", "1", "2", "--load", "low", "high", "high"],
    ["--request-rates", "1", "2", "--num-prompts", "4", "8", "16"],
    ["--request-rates", "0"],
    ["--request-rates", "1", "--goodput", "ttft=20000"],
    ["--request-rates", "1", "--goodput", "latency:20"],
    ["--request-rates", "1", "1", "--load", "low", "high"],
])
def test_rate_options_that_make_no_sense(extra, capsys):
    with pytest.raises(SystemExit):
        bench_serve.parse_args(["--target", "T", "--modes", "plain", "--out-dir", "x",
                                *extra])
    assert "error:" in capsys.readouterr().err


def _bench_serve_args(cmd: list[str]):
    """``cmd``'s arguments as vLLM 0.26's own ``vllm bench serve`` parses them."""
    import argparse

    serve = pytest.importorskip("vllm.benchmarks.serve")
    parser = argparse.ArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(cmd[cmd.index("serve") + 1:])
    return args, serve.check_goodput_args(args)


def test_rate_run_command(tmp_path):
    """A rate's run: Poisson arrivals at the rate, no cap on the requests in
    flight, the SLOs, p50 / p90 / p99, per-request data saved; a burst's run
    caps the requests in flight and has no rate. vLLM's parser takes both."""
    args = bench_serve.parse_args([*RATE_ARGS, "--out-dir", str(tmp_path)])
    low, _ = bench_serve.traffics(args)
    result = tmp_path / "bench" / "r.json"
    cmd = bench_serve.bench_command(args, "http://h:1", tmp_path / "d.jsonl", low,
                                    result)
    assert cmd[cmd.index("--request-rate") + 1] == "0.5"
    assert cmd[cmd.index("--goodput") + 1:][:2] == ["ttft:20000", "tpot:50"]
    assert "--max-concurrency" not in cmd and "--save-detailed" in cmd
    parsed, slo = _bench_serve_args(cmd)
    assert (parsed.request_rate, parsed.burstiness, parsed.max_concurrency) == (
        0.5, 1.0, None)
    assert slo == {"ttft": 20000.0, "tpot": 50.0}
    assert (parsed.num_prompts, parsed.metric_percentiles) == (8, "50,90,99")
    assert (parsed.result_dir, parsed.result_filename) == (str(result.parent), "r.json")
    assert parsed.save_result and parsed.save_detailed and parsed.ignore_eos

    burst = bench_serve.parse_args(["--target", "T", "--modes", "plain",
                                    "--concurrency", "4", "--out-dir", str(tmp_path)])
    cmd = bench_serve.bench_command(burst, "http://h:1", tmp_path / "d.jsonl",
                                    bench_serve.traffics(burst)[0], result)
    assert "--request-rate" not in cmd and "--goodput" not in cmd
    parsed, slo = _bench_serve_args(cmd)
    assert (parsed.request_rate, parsed.max_concurrency, parsed.num_prompts, slo) == (
        float("inf"), 4, 8, {})


def test_mean_in_flight():
    """Requests over [0, 2] and [1, 3]: 4 request-seconds over 3 s."""
    from benchmarks.harness.measure import mean_in_flight

    assert mean_in_flight([(0.0, 2.0), (1.0, 3.0)]) == pytest.approx(4 / 3)
    assert mean_in_flight([(5.0, 6.0)]) == 1.0
    assert mean_in_flight([(1.0, 1.0)]) is None
    assert mean_in_flight([]) is None


def test_in_flight_counts_the_requests_that_completed():
    """Each request from its start to its last token (TTFT + ITLs); a failed
    request (no known end) counts neither its time nor its start."""
    bench = {"start_times": [10.0, 11.0, 0.0], "ttfts": [1.0, 0.5, 0.0],
             "itls": [[0.5, 0.5], [1.0], []], "errors": ["", "", "timeout"]}
    # [10, 12] and [11, 12.5]: 3.5 request-seconds over 2.5 s.
    assert bench_serve.in_flight(bench) == pytest.approx(3.5 / 2.5)
    assert bench_serve.in_flight({**bench, "errors": ["x", "y", "z"]}) is None


def test_ttft_growth_tells_a_growing_queue():
    """The last third's median first-token time over the first third's: the
    H200 32K runs of 2026-11-28 gave 0.9-1.1 where the server kept up and
    2.7-4.8 past its capacity; a failed request does not count."""
    from benchmarks.harness.measure import QUEUE_GROWTH, ttft_growth
    steady = {"start_times": [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], "ttfts": [1.4] * 6,
              "errors": [""] * 6}
    assert bench_serve.queue_growth(steady) == pytest.approx(1.0)
    growing = {**steady, "ttfts": [1.0, 2.0, 5.0, 8.0, 12.0, 16.0]}
    assert bench_serve.queue_growth(growing) == pytest.approx(14.0 / 1.5)
    assert bench_serve.queue_growth(growing) > QUEUE_GROWTH
    # Out of order and a failure: sorted by start, the failed one left out.
    shuffled = {"start_times": [10.0, 0.0, 8.0, 2.0, 6.0, 4.0, 12.0],
                "ttfts": [16.0, 1.0, 12.0, 2.0, 8.0, 5.0, 0.0],
                "errors": ["", "", "", "", "", "", "timeout"]}
    assert bench_serve.queue_growth(shuffled) == pytest.approx(14.0 / 1.5)
    assert ttft_growth([0.0, 1.0], [1.0, 9.0]) is None, "under 3 requests"


def test_a_saved_rate_result_gives_the_runs_figures():
    run = bench_serve.run_figures(saved_rate_result(), {}, GpuBusy())
    assert (run["request_rate"], run["max_concurrency"]) == (2.0, None)
    assert (run["completed"], run["failed"], run["errors"]) == (3, 1, ["Bad Request"])
    assert run["output_throughput"] == 6.0
    assert run["request_goodput"] == 0.5  # one request met TTFT <= 500 ms
    assert (run["p50_ttft_ms"], run["p90_ttft_ms"], run["p99_ttft_ms"]) == (
        pytest.approx(600), pytest.approx(840), pytest.approx(894))
    assert run["p90_tpot_ms"] == pytest.approx(93.33, abs=0.01)
    assert run["p90_itl_ms"] == pytest.approx(120)
    # (0.6 + 0.8 + 1.2) request-seconds over [100, 102.2].
    assert run["in_flight"] == pytest.approx(2.6 / 2.2)
    # The decode-phase figures as in bursts: 3 tokens a request over the
    # union of [100.4, 100.6], [101.1, 101.3], [101.9, 102.2].
    assert run["decode_tokens"] == 9 and run["decode_s"] == pytest.approx(0.7)
    assert "ttfts" not in run and "start_times" not in run


def rate_result(tmp_path) -> dict:
    """A result of plain at two rates and spec_extend at one, each cell three
    runs of the saved file with ``in_flight`` scaled to the rate (4 a request
    per second) and a steady queue, and a burst cell beside them."""
    args = bench_serve.parse_args([*RATE_ARGS, "--modes", "plain", "spec_extend",
                                   "--draft", "D", "--out-dir", str(tmp_path)])
    run = bench_serve.run_figures(saved_rate_result(), {}, GpuBusy())
    result = {"meta": {"vllm": "v", "torch": "t", "date_utc": "d", "git_commit": None,
                       "hardware": {"device": "GPU"},
                       "config": {**{k: v for k, v in vars(args).items()
                                     if k != "out_dir"},
                                  "acceptance_length": 3.0}},
              "servers": [], "results": []}
    for mode, traffic in (("plain", bench_serve.traffics(args)[0]),
                          ("plain", bench_serve.traffics(args)[1]),
                          ("spec_extend", bench_serve.traffics(args)[1])):
        cell = bench_serve.Cell("long", 256, None, 8, 16, [], [],
                                request_rate=traffic.request_rate, load=traffic.load)
        # A steady queue: the saved run's three requests time no growth.
        runs = [{**run, "in_flight": 4 * traffic.request_rate + i, "server_metrics": {},
                 "ttft_growth": 1.0} for i in (-1, 0, 1)]
        result["results"].append(bench_serve.cell_row(args, mode, cell, runs))
    burst = bench_serve.Cell("long", 256, 4, 8, 16, [], [])
    result["results"].append(bench_serve.cell_row(
        args, "plain", burst, [{**run, "server_metrics": {}}] * 3))
    return result


def test_rate_rows_and_their_table(tmp_path):
    result = rate_result(tmp_path)
    row = result["results"][1]
    assert (row["concurrency"], row["request_rate"], row["load"]) == (None, 2.0, "high")
    assert row["goodput_slo"] == {"ttft": 20000.0, "tpot": 50.0}
    assert row["goodput"] == {"min": 0.5, "median": 0.5, "max": 0.5, "n": 3}
    assert row["in_flight"] == {"min": 7.0, "median": 8.0, "max": 9.0, "n": 3}
    assert row["ttft_p90_ms"]["median"] == pytest.approx(840)
    assert row["failed_requests"] == 3 and row["failed_runs"] == 0
    assert "request_rate" not in result["results"][3]  # the burst's row
    text = bench_serve.table(result)
    rates, burst = text.split("### long: 256-token inputs")
    assert rates.startswith("### long at request rates: 256-token inputs, 16 output")
    lines = [ln for ln in rates.splitlines() if ln.startswith("| ")]
    assert lines[0] == bench_serve.RATE_HEAD
    # Requests a run beside the runs: a shorter run is another measurement.
    assert [ln.split(" | ")[:6] for ln in lines[1:]] == [
        ["| plain", "0.5", "low", "8", "3/3", "3"],
        ["| plain", "2", "high", "8", "3/3", "3"],
        ["| spec_extend", "2", "high", "8", "3/3", "3"]]
    # output tok/s, goodput, in flight; TTFT p50 / p90 / p99
    assert lines[1].split(" | ")[6:9] == ["6 (6–6)", "0.50 (0.50–0.50)",
                                          "2.0 (1.0–3.0)"]
    assert lines[1].split(" | ")[11] == "600 (600–600) / 840 (840–840) / 894 (894–894)"
    assert "Goodput: the completed requests per second that met TTFT ≤ 20000 ms, " \
        "TPOT ≤ 50 ms." in rates
    # plain: 2 in flight at 0.5/s, 8 at 2/s: the line through them reaches 16
    # at 4/s; spec_extend, one rate: Little's law, 2 x 16 / 8.
    assert "run next at (req/s, `next_rate`): plain 4, spec_extend 4." in rates
    assert "| plain | 4 | 3/3 | 3 |" in burst and "| mode | concurrency |" in burst


def test_rate_notes_cap_a_proposal_at_an_overload_and_mark_a_long_reach(tmp_path):
    """The proposal under a table: capped at 90% of what an overloaded run
    of its series completed, as ``find_rate`` caps its probes; marked where
    Little's law reaches past twice every rate run (2026-11-29: 2.4 req/s
    proposed from 1.6 in flight at 0.24, for a server that completes 0.53)."""
    result = rate_result(tmp_path)
    plain_high = result["results"][1]
    plain_high["runs"] = [{**run, "ttft_growth": 3.0, "request_throughput": 1.0}
                          for run in plain_high["runs"]]
    rows = [r for r in result["results"] if bench_serve.rated(r)]
    note = bench_serve.rate_notes(rows, 16)[1]
    assert ("plain 0.9 (90% of the 1 req/s it completed with a growing queue), "
            "spec_extend 4.") in note
    low = [{"mode": "plain", "request_rate": 0.24, "in_flight": {"median": 1.6},
            "runs": [{"ttft_growth": 1.03, "request_throughput": 0.23}]}]
    assert bench_serve.rate_notes(low, 16)[1].endswith(
        "plain 2.4 (past twice every rate run: its queue may grow first).")


def test_next_rate():
    """Little's law from one probe; from two, the line through the two
    nearest the target, bounded by Little's law from the nearer beyond both;
    Little's law where that line falls."""
    assert bench_serve.next_rate([(2.0, 8.0)]) == 4.0
    assert bench_serve.next_rate([(2.0, 32.0)], target=16) == 1.0
    # Latency grew with the load: 20 in flight at 4/s, not 16.
    assert bench_serve.next_rate([(2.0, 8.0), (4.0, 20.0)]) == pytest.approx(10 / 3)
    # The two nearest of three.
    assert bench_serve.next_rate([(1.0, 3.0), (2.0, 8.0), (4.0, 20.0)]) == (
        pytest.approx(10 / 3))
    # Beyond both, going up: the line (latency grows), or Little's law where
    # the line is flatter than the latency it measured (noise).
    assert bench_serve.next_rate([(2.0, 2.0), (4.0, 6.0)]) == pytest.approx(9.0)
    assert bench_serve.next_rate([(2.0, 4.0), (4.0, 6.0)]) == pytest.approx(64 / 6)
    # Going down: the line, never below Little's law (nor at a rate <= 0).
    assert bench_serve.next_rate([(4.0, 20.0), (6.0, 40.0)]) == pytest.approx(3.6)
    assert bench_serve.next_rate([(4.0, 17.0), (10.0, 18.0)]) == pytest.approx(64 / 17)
    assert bench_serve.next_rate([(2.0, 8.0), (4.0, 7.0)]) == 4.0  # falls: noise
    assert bench_serve.next_rate([(2.0, 8.0), (2.0, 9.0)]) == pytest.approx(32 / 9)
    assert bench_serve.next_rate([]) is None
    assert bench_serve.next_rate([(2.0, 0.0)]) is None


def test_rate_plots_apart_from_bursts(tmp_path):
    """A file with bursts and rates: a plot of each, the rates' against the rate."""
    pytest.importorskip("matplotlib")
    from benchmarks.serve import plot_serve

    result = rate_result(tmp_path)
    paths = plot_serve.plot_all(result, tmp_path)
    assert [p.name for p in paths] == ["serve_rate_long_256.png", "serve_long_256.png"]
    fig = plot_serve.figure(result, "long", 256, at_rate=True)
    assert fig.axes[0].get_xlabel() == "request rate (req/s)"
    assert sorted(tuple(c.lines[0].get_xdata()) for c in fig.axes[0].containers) == [
        (0.5, 2.0), (2.0,)]


def _queue(rate: float) -> float:
    """A server whose latency grows with the load (20 s unloaded, saturating
    at 1 request/s): its mean requests in flight at ``rate`` (Little's law)."""
    return rate * 20.0 / (1.0 - rate)


def _queue_run(rate: float) -> dict:
    """A probe run on ``_queue``'s server, which keeps up below 1 request/s:
    a finite run completes well under its rate (the last requests drain; at
    16 in flight of 32 about two thirds of it), yet its queue does not grow."""
    n = _queue(rate)
    return {"in_flight": n, "request_throughput": rate * 32 / (32 + n),
            "ttft_growth": 1.1}


def _overloaded_run(rate: float) -> dict:
    """A probe run on a server whose capacity is 0.535 requests/s (the H200
    8B at 32K/512 of 2026-11-28): past it the queue grows all run long (the
    last third's first tokens 3-5 times later than the first third's), and a
    32-request run's mean in flight still grows with the rate."""
    over = rate > 0.535
    return {"in_flight": 14.8 * rate if over else 9.8 * rate,
            "request_throughput": 0.535 if over else 0.93 * rate,
            "ttft_growth": 3.6 if over else 1.1}


def test_find_rate_closes_in_on_the_target():
    """The first probe at the given rate, each next one at next_rate of those
    before; 16 in flight is at 16/36 req/s here."""
    rate, probes, capacity = bench_serve.find_rate(_queue_run, 0.3, 2)
    assert [r for r, _ in probes] == [0.3, pytest.approx(0.3 * 16 / _queue(0.3))]
    assert rate == pytest.approx(16 / 36, rel=0.08)
    # The second probe completed under 80% of its rate (the drain), yet its
    # queue did not grow: no capacity is taken from it.
    assert _queue_run(probes[1][0])["request_throughput"] < 0.8 * probes[1][0]
    assert capacity is None, "no probe ran past the server's capacity"
    rate3, _, _ = bench_serve.find_rate(_queue_run, 0.3, 3)
    assert abs(rate3 - 16 / 36) < abs(rate - 16 / 36)
    # No probe with a request in flight: no rate, and no probe after the first.
    assert bench_serve.find_rate(lambda r: {}, 0.3, 3) == (None, [(0.3, None)], None)


def test_find_rate_stays_below_a_capacity_a_probe_ran_past():
    """A probe that completed far fewer requests a second than arrived ran
    past the capacity: the rate found is at most CAPACITY_SHARE of it, not
    where a finite overloaded run's in-flight line crosses the target."""
    rate, probes, capacity = bench_serve.find_rate(_overloaded_run, 0.4, 2)
    assert probes[1][0] > 1.0, "Little's law from the first probe overshoots"
    assert capacity == pytest.approx(0.535)
    assert rate == pytest.approx(bench_serve.CAPACITY_SHARE * 0.535)
    # A third probe goes no higher than the cap either.
    _, probes3, _ = bench_serve.find_rate(_overloaded_run, 0.4, 3)
    assert probes3[2][0] == pytest.approx(bench_serve.CAPACITY_SHARE * 0.535)


FIND_ARGS = ["--target", "T", "--modes", "plain", "spec_extend", "--draft", "D",
             "--workloads", "long", "--input-lens", "256", "--find-rate", "0.3",
             "--num-prompts", "4", "--runs", "2"]


@pytest.mark.parametrize("extra", [
    ["--request-rates", "1"], ["--load", "high", "high"], ["--concurrency", "4"],
    ["--probes", "0"], ["--input-lens", "256", "512"],
])
def test_find_rate_options_that_make_no_sense(extra, capsys):
    with pytest.raises(SystemExit):
        bench_serve.parse_args([*FIND_ARGS, "--out-dir", "x", *extra])
    assert "error:" in capsys.readouterr().err


def test_find_rate_probes_on_the_first_server_only(tiny_target, long_prompts,
                                                   tmp_path, monkeypatch):
    """The first mode's server runs the probes (documents of their own),
    then every mode runs the table at the rate found and half of it, high
    first."""
    args = bench_serve.parse_args([*FIND_ARGS[:-8], "--target", tiny_target,
                                   *FIND_ARGS[-8:], "--out-dir", str(tmp_path)])
    warmups, cells = bench_serve.plan(args)
    assert [(c.load, len(c.datasets)) for c in cells] == [
        ("probe", 2), ("high", 2), ("low", 2)]
    texts = [p.read_text() for c in cells for p in c.datasets]
    assert len(set(texts)) == len(texts), "no document serves a probe and a run"

    ran = []

    def run_cell(args, client, base, mode, cell, logs):
        ran.append((mode, cell.load, cell.request_rate, len(cell.datasets)))
        return [{**_queue_run(cell.request_rate), "acceptance_length": None}
                for _ in cell.datasets]

    monkeypatch.setattr(bench_serve, "serve", lambda *a, **k: _Server())
    monkeypatch.setattr(bench_serve, "complete", lambda *a, **k: None)
    monkeypatch.setattr(bench_serve, "run_cell", run_cell)
    monkeypatch.setattr(bench_serve, "log_errors", lambda log: [])
    monkeypatch.setattr(bench_serve, "async_scheduling", lambda log: True)
    monkeypatch.setattr(bench_serve, "resolved_prompt_pool", lambda log: None)
    monkeypatch.setattr(bench_serve, "jit_after_start", lambda log: [])
    (tmp_path / "logs").mkdir()
    result = {"meta": {"config": {}}, "servers": [], "results": []}
    for mode in args.modes:
        bench_serve.run_mode(args, None, mode, warmups, cells, result,
                             tmp_path / "results.json")
    assert [s.get("error") for s in result["servers"]] == [None, None]
    high, _, _ = bench_serve.find_rate(_queue_run, 0.3, 2)
    high = float(f"{high:.3g}")
    low = float(f"{high / 2:.3g}")
    assert ran == [("plain", "probe", 0.3, 1), ("plain", "probe", ran[1][2], 1),
                   ("plain", "high", high, 2), ("plain", "low", low, 2),
                   ("spec_extend", "high", high, 2), ("spec_extend", "low", low, 2)]
    assert result["probes"]["high_rate"] == pytest.approx(high, rel=1e-2)
    assert [r["request_rate"] for r in result["probes"]["runs"]] == [0.3, ran[1][2]]
    assert [(r["load"], r["request_rate"]) for r in result["results"]] == [
        ("high", high), ("low", low)] * 2
    assert result["meta"]["config"]["request_rates"] == [low, high]


def test_find_rate_runs_the_loads_asked_for(tiny_target, long_prompts, tmp_path):
    """``--load high`` with ``--find-rate``: the probes, then the high load
    alone (a session with device time for the done-when's load only)."""
    args = bench_serve.parse_args([*FIND_ARGS[:-8], "--target", tiny_target,
                                   *FIND_ARGS[-8:], "--out-dir", str(tmp_path),
                                   "--load", "high"])
    _, cells = bench_serve.plan(args)
    assert [(c.load, len(c.datasets)) for c in cells] == [("probe", 2), ("high", 2)]
    bench_serve.set_rates(cells[1:], {"probes": {"high_rate": 0.41},
                                      "meta": {"config": {}}})
    assert cells[1].request_rate == 0.41


def test_rate_table_says_how_its_rates_were_found(tmp_path):
    result = rate_result(tmp_path)
    result["probes"] = {"mode": "plain", "high_rate": 2.0, "runs": [
        {"request_rate": 0.3, "in_flight": 4.0}, {"request_rate": 1.2, "in_flight": None}]}
    assert ("Rates found (`--find-rate`) on the plain server: probes at 0.3 req/s "
            "(4.0 in flight), 1.2 req/s (none in flight); high 2 req/s, low half of it."
            ) in bench_serve.table(result)
    result["probes"]["capacity"] = 2.2
    assert ("A probe ran past the server's capacity, 2.2 completed req/s: high is "
            "at most 90% of it.") in bench_serve.table(result)


def test_a_probe_that_fails_stops_the_table(tiny_target, long_prompts, tmp_path,
                                            monkeypatch):
    """A probe that raises (its server died, say): the probes so far are kept,
    no rate is set, and no mode runs the table at the placeholder rates."""
    args = bench_serve.parse_args([*FIND_ARGS[:-8], "--target", tiny_target,
                                   *FIND_ARGS[-8:], "--out-dir", str(tmp_path)])
    warmups, cells = bench_serve.plan(args)
    ran = []

    def run_cell(args, client, base, mode, cell, logs):
        ran.append((mode, cell.load))
        if len(ran) == 2:
            raise OSError("the server went away")
        return [{"in_flight": 5.0, "acceptance_length": None}]

    monkeypatch.setattr(bench_serve, "serve", lambda *a, **k: _Server())
    monkeypatch.setattr(bench_serve, "complete", lambda *a, **k: None)
    monkeypatch.setattr(bench_serve, "run_cell", run_cell)
    monkeypatch.setattr(bench_serve, "log_errors", lambda log: [])
    monkeypatch.setattr(bench_serve, "async_scheduling", lambda log: True)
    monkeypatch.setattr(bench_serve, "resolved_prompt_pool", lambda log: None)
    monkeypatch.setattr(bench_serve, "jit_after_start", lambda log: [])
    monkeypatch.setattr(bench_serve, "BenchClient", _NoClient)
    monkeypatch.setattr(bench_serve, "plan", lambda args: (warmups, cells))
    monkeypatch.setattr(bench_serve, "table", lambda result: "")
    bench_serve.main([*FIND_ARGS[:-8], "--target", tiny_target, *FIND_ARGS[-8:],
                      "--out-dir", str(tmp_path)])
    result = json.loads((tmp_path / "results.json").read_text())
    assert ran == [("plain", "probe"), ("plain", "probe")]
    assert result["probes"]["high_rate"] is None
    assert [r["request_rate"] for r in result["probes"]["runs"]] == [0.3]
    assert result["results"] == [] and "went away" in result["servers"][0]["error"]
    assert [s["mode"] for s in result["servers"]] == ["plain"]


class _Server:
    """What run_mode reads of a started server, without one."""
    base, startup_s, command, forced_stop = "http://x", 1.0, ["vllm"], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _NoClient:
    def __init__(self, *a):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
