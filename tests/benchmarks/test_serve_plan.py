"""``benchmarks.bench_serve`` without a server: its datasets, the flags of
each mode, acceptance, and the decode-phase throughput and GPU busy share
from vLLM bench's per-request data."""

from __future__ import annotations

import json

import pytest

from benchmarks import bench_serve
from benchmarks.harness.gpu_busy import GpuBusy

WORKLOADS = ["long", "shared-doc", "short"]


def test_datasets(tiny_target, long_prompts, tmp_path):
    """Every run its own documents, the same in every mode; shared-doc runs
    share one document and differ in the question; no plan touches a server."""
    args = bench_serve.parse_args(
        ["--target", tiny_target, "--modes", "plain", "--input-lens", "256",
         "--concurrency", "1", "2", "--runs", "2", "--out-dir", str(tmp_path)])
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
    busy.samples = [(1.2, 0.0), (2.0, 0.9), (3.8, 0.7), (4.5, 0.0), (6.1, 0.0)]
    assert bench_serve.decode_phase(bench, busy) == {
        "decode_s": 2.5, "decode_tokens": 4, "decode_tok_s": 4 / 2.5,
        "gpu_busy": pytest.approx(0.8)}
    busy.samples = []  # no NVML
    assert bench_serve.decode_phase(bench, busy)["gpu_busy"] is None


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
