"""benchmarks.merge_results: result files of separate device calls as one."""

from __future__ import annotations

import importlib.util
import json

import pytest

from benchmarks import merge_results


def part(key, mode, date):
    return {"meta": {"date_utc": date, "command": f"run {mode}",
                     "config": {"modes": [mode]}},
            key: [{"mode": mode, "concurrency": 1}]}


def test_rows_modes_and_calls():
    merged = merge_results.merge([part("results", "plain", "2026-11-22T16:18"),
                                  part("results", "draft_model", "2026-11-22T16:09")])
    assert [r["mode"] for r in merged["results"]] == ["plain", "draft_model"]
    assert merged["meta"]["config"]["modes"] == ["plain", "draft_model"]
    assert merged["meta"]["date_utc"] == "2026-11-22T16:09"
    assert [c["command"] for c in merged["meta"]["calls"]] == ["run plain",
                                                               "run draft_model"]


def test_the_rate_probes_survive_a_merge():
    """bench_serve --find-rate's probes (a dict, in the first server's call)."""
    first = part("results", "plain", "2026-11-22T16:09")
    first["probes"] = {"mode": "plain", "high_rate": 0.4, "runs": [{"request_rate": 0.3}]}
    merged = merge_results.merge([part("results", "spec_extend", "2026-11-22T16:18"), first])
    assert merged["probes"] == first["probes"]
    assert "probes" not in merge_results.merge([part("results", "plain", "d")])


def test_refuses_different_benchmarks():
    with pytest.raises(ValueError, match="same benchmark"):
        merge_results.merge([part("runs", "plain", "a"), part("results", "plain", "b")])


def serve_part(mode: str, busy: list | None = None) -> dict:
    """A bench_serve result of one server: one long-workload cell, 3 runs,
    with each run's GPU busy share where ``busy`` is given (older files: no
    key)."""
    def spread(v):
        return {"min": v - 1, "median": v, "max": v + 1, "n": 3}

    run = {"output_throughput": 100.0, "server_metrics": {}, "completed": 4,
           "failed": 0}
    runs = ([run] * 3 if busy is None
            else [{**run, "gpu_busy": b} for b in busy])
    row = {"workload": "long", "input_len": 16384, "output_len": 1024, "mode": mode,
           "draft": None if mode == "plain" else "d", "concurrency": 4,
           "num_prompts": 4, "runs": runs, "failed_requests": 0,
           "failed_runs": 0, "acceptance_length": None if mode == "plain" else 3.0,
           **{key: spread(10.0) for key in (
               "output_tok_s", "decode_tok_s", "ttft_p50_ms", "ttft_p99_ms",
               "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms")}}
    return {"meta": {"bench": "serve", "date_utc": f"2026-12-01T0{len(mode)}",
                     "command": f"serve {mode}", "vllm": "0.26.0", "torch": "2.11",
                     "git_commit": "abc", "hardware": {"device": "GPU"},
                     "config": {"modes": [mode], "target": "t", "draft": "d",
                                "acceptance_length": 3.0, "datasets": ["pg19"],
                                "num_spec_tokens": 4, "runs": 3}},
            "servers": [{"mode": mode, "command": "vllm serve t", "startup_s": 90.0,
                         "async_scheduling": mode == "plain", "forced_stop": [],
                         "log_errors": []}],
            "results": [row]}


def test_serve_parts_get_summary_and_plots(tmp_path):
    files = []
    # A file from before the sampler, one with a run without a sample.
    for mode, busy in (("plain", None), ("spec_extend", [0.97, None, 0.99])):
        files.append(tmp_path / f"{mode}.json")
        files[-1].write_text(json.dumps(serve_part(mode, busy)))
    out = tmp_path / "merged" / "results.json"
    assert merge_results.main([str(out), *map(str, files)]) == 0
    merged = json.loads(out.read_text())
    assert [s["mode"] for s in merged["servers"]] == ["plain", "spec_extend"]
    summary = (out.parent / "summary.md").read_text()
    assert "### long: 16384-token inputs, 1024 output tokens" in summary
    assert summary.count("| plain | 4 |") == 1 and summary.count("| spec_extend |") == 2
    assert "| decode tok/s | GPU busy % |" in summary
    assert "| plain | 4 | 3/3 | 0 | 10 (9–11) | 10 (9–11) | – |" in summary
    assert ("| spec_extend | 4 | 3/3 | 0 | 10 (9–11) | 10 (9–11) | 98 (97–99) |"
            in summary)
    assert "| plain | 90 | True | yes |" in summary
    if importlib.util.find_spec("matplotlib"):
        png = out.parent / "serve_long_16384.png"
        assert png.read_bytes().startswith(b"\x89PNG")


def decode_part(date: str, cells: dict[str, list[float]], **config) -> dict:
    """A bench_decode result: one 64K batch-1 row per mode with these runs."""
    rows = [{"mode": mode, "draft": "d", "context": 65536, "batch": 1,
             "decode_tok_s": {}, "e2e_tok_s": {}, "gpu_busy": [],
             "runs": [{"decode_tok_s": t, "e2e_tok_s": t - 1, "gpu_busy": 0.9}
                      for t in tok_s]} for mode, tok_s in cells.items()]
    return {"meta": {"bench": "decode", "date_utc": date, "command": "c",
                     "config": {"modes": list(cells), "out": date, **config}},
            "engines": [], "results": rows}


def test_pool_makes_one_cell_of_the_calls_runs():
    pooled = merge_results.pool([
        decode_part("b", {"spec_extend": [191, 190, 192], "draft_model": [133, 126, 136]}),
        decode_part("a", {"draft_model": [114, 111, 135], "spec_extend": [191, 191, 190]})])
    cells = {r["mode"]: r for r in pooled["results"]}
    assert list(cells) == ["spec_extend", "draft_model"]
    dm = cells["draft_model"]
    assert [r["decode_tok_s"] for r in dm["runs"]] == [133, 126, 136, 114, 111, 135]
    assert dm["decode_tok_s"] == {"min": 111, "median": 129.5, "max": 136, "n": 6}
    assert dm["e2e_tok_s"]["median"] == 128.5 and dm["runs_from_calls"] == 2
    assert dm["gpu_busy"] == [0.9] * 6
    assert "ttft_s" not in dm  # runs from before bench_decode timed it
    assert pooled["meta"]["date_utc"] == "a"


def test_pool_spreads_the_time_to_first_token():
    parts = [decode_part(d, {"spec_extend": tok_s})
             for d, tok_s in (("a", [190, 191]), ("b", [192]))]
    for part_, ttft in zip(parts, ([2.0, 2.2], [2.1]), strict=True):
        for run, t in zip(part_["results"][0]["runs"], ttft, strict=True):
            run["ttft_s"] = t
    cell = merge_results.pool(parts)["results"][0]
    assert cell["ttft_s"] == {"min": 2.0, "median": 2.1, "max": 2.2, "n": 3}


def test_pool_refuses_calls_of_different_configs():
    with pytest.raises(ValueError, match="spec_extend differ"):
        merge_results.pool([decode_part("a", {"spec_extend": [1]}, spec_extend="{}"),
                            decode_part("b", {"spec_extend": [2]},
                                        spec_extend='{"draft_vocab": 8}')])
    with pytest.raises(ValueError, match="bench_decode"):
        merge_results.pool([part("results", "plain", "a")])


def test_merge_refuses_files_of_different_plugin_configs():
    # summarize labels a merged file's rows by its first config: a variant's
    # calls must not hide among the defaults' (nor the defaults among it).
    a, b = part("results", "plain", "a"), part("results", "spec_extend", "b")
    a["meta"]["config"]["spec_extend"] = '{"top_k": 32, "recent_tokens": 256}'
    b["meta"]["config"]["spec_extend"] = (
        '{"top_k": 32, "recent_tokens": 256, "draft_prefill_window": 2048}')
    with pytest.raises(ValueError, match="different plugin configs"):
        merge_results.merge([a, b])
    b["meta"]["config"]["spec_extend"] = '{"recent_tokens": 256, "top_k": 32}'
    assert len(merge_results.merge([a, b])["results"]) == 2


def test_pool_refuses_calls_of_other_devices_or_switches():
    a = decode_part("a", {"spec_extend": [1]})
    b = decode_part("b", {"spec_extend": [2]})
    a["meta"]["hardware"] = {"device": "NVIDIA H100 80GB HBM3"}
    b["meta"]["hardware"] = {"device": "NVIDIA H200"}
    with pytest.raises(ValueError, match="one kind of device"):
        merge_results.pool([a, b])
    b["meta"]["hardware"] = a["meta"]["hardware"]
    b["engines"] = [{"mode": "spec_extend",
                     "plugin_env": {"SPECEXTEND_DRAFT_AOT": "0"}}]
    with pytest.raises(ValueError, match="same tuning switches"):
        merge_results.pool([a, b])
    b["engines"] = [{"mode": "spec_extend", "plugin_env": {"SPECEXTEND_DATA_DIR": "/x"}}]
    assert merge_results.pool([a, b])["results"][0]["runs_from_calls"] == 2
