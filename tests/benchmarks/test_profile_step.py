"""``benchmarks.gpu.profile_step``'s reading of vLLM's runner scopes."""

from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import pytest

from benchmarks.gpu.profile_step import (
    GENERATE_MARK,
    category,
    first_token_window,
    idle_gaps,
    keep_rank0_trace,
    kernel_ms_by_category,
    main,
    rank_summaries,
    rank_traces,
    runner_scopes,
    scope_kernels,
    scope_spans,
    window_work,
)


def test_runner_scopes_keep_only_vllms_scopes_with_host_and_device_ms():
    cpu, cuda = SimpleNamespace(name="CPU"), SimpleNamespace(name="CUDA")
    events = [
        SimpleNamespace(key="gpu_model_runner: draft", count=2, device_type=cpu,
                        cpu_time_total=3000.0, device_time_total=61500.0),
        # torch's GPU annotation of the same scope: its span on the GPU.
        SimpleNamespace(key="gpu_model_runner: draft", count=2, device_type=cuda,
                        cpu_time_total=0.0, device_time_total=70000.0),
        SimpleNamespace(key="gpu_model_runner: forward", count=2, device_type=cpu,
                        cpu_time_total=1000.0, device_time_total=450000.0),
        SimpleNamespace(key="aten::mm", count=9, device_type=cpu, cpu_time_total=1.0,
                        device_time_total=5.0),
    ]
    assert runner_scopes(events) == {
        "draft": {"calls": 2, "cpu_ms": 3.0, "device_ms": 61.5, "gpu_span_ms": 70.0},
        "forward": {"calls": 2, "cpu_ms": 1.0, "device_ms": 450.0},
    }


def test_kernel_categories():
    assert category("flash_fwd_splitkv_kernel") == "attention"
    assert category("nvjet_tst_64x8_64x16") == "matmul"
    assert category("Memcpy DtoH") == "copy"
    assert category("triton_poi_fused_mul_silu") == "triton"
    assert category("rms_norm_kernel") == "other"


def _ev(cat, name, ts, dur):
    return {"cat": cat, "name": name, "ts": ts, "dur": dur}


TRACE = [
    # Step 1: a draft span with a fresh request's extra work, then an empty one.
    _ev("gpu_user_annotation", "gpu_model_runner: draft", 0.0, 9000.0),
    _ev("kernel", "nvjet_sm90_tst_64x8", 0.0, 8000.0),
    _ev("gpu_user_annotation", "gpu_model_runner: draft", 9500.0, 1.0),
    # Steps 2 and 3: 5 ms spans with 4 ms of kernels (one straddles the end).
    _ev("gpu_user_annotation", "gpu_model_runner: draft", 10000.0, 5000.0),
    _ev("kernel", "flash_fwd_kernel", 10000.0, 3000.0),
    _ev("gpu_memcpy", "Memcpy DtoD", 14000.0, 2000.0),
    _ev("gpu_user_annotation", "gpu_model_runner: draft", 20000.0, 5000.0),
    _ev("kernel", "flash_fwd_kernel", 20500.0, 4000.0),
    # A kernel that started before the span runs into it, and two streams
    # overlap: 10 ms of the 20 ms span are busy, the overlap counted once.
    _ev("kernel", "nvjet_sm90_tst_128x16", 28000.0, 6000.0),
    _ev("gpu_user_annotation", "gpu_model_runner: forward", 30000.0, 20000.0),
    _ev("kernel", "nvjet_sm90_tst_128x16", 40000.0, 6000.0),
    _ev("kernel", "triton_poi_fused", 42000.0, 2000.0),
    # Host events and annotations outside vLLM's scopes count for nothing.
    _ev("cpu_op", "aten::mm", 0.0, 50000.0),
    _ev("gpu_user_annotation", "llm_engine step: get_output", 0.0, 50000.0),
]


def test_scope_spans_take_medians_and_leave_out_empty_spans():
    spans = scope_spans(TRACE)
    assert spans["draft"] == {"calls": 3, "median_span_ms": 5.0, "median_busy_ms": 4.0}
    assert spans["forward"] == {"calls": 1, "median_span_ms": 20.0,
                                "median_busy_ms": 10.0}
    assert set(spans) == {"draft", "forward"}


def test_scope_kernels_take_each_kernels_median_over_the_spans():
    """The draft's three spans: flash_fwd_kernel ran in two (3 and 4 ms), the
    first span's matmul and the second's copy in one each: their medians are
    0 and they are left out; the straddling kernel started before the span.
    The totals are each span's sum, then the median (1 launch; 5, 8 and 4 ms)."""
    kernels = scope_kernels(TRACE)
    assert kernels["draft"] == {
        "launches": 1, "us": 5000.0,
        "top": [{"kernel": "flash_fwd_kernel", "calls": 1, "us": 3000.0}]}
    assert kernels["forward"]["top"] == [
        {"kernel": "nvjet_sm90_tst_128x16", "calls": 1, "us": 6000.0},
        {"kernel": "triton_poi_fused", "calls": 1, "us": 2000.0}]
    assert (kernels["forward"]["launches"], kernels["forward"]["us"]) == (2, 8000.0)
    top = scope_kernels(TRACE, top=1)["forward"]["top"]
    assert [k["kernel"] for k in top] == ["nvjet_sm90_tst_128x16"]


def test_kernel_ms_count_work_not_annotations():
    assert kernel_ms_by_category(TRACE) == {"matmul": 20.0, "attention": 7.0,
                                            "copy": 2.0, "triton": 2.0}


def test_each_tp_ranks_trace_summarized_as_its_own_gpu(tmp_path):
    """vLLM's worker profiler writes a trace per rank; each is read as one
    GPU's, by the rank in its name, per profiled step."""
    other = [_ev("kernel", "flash_fwd_kernel", 0.0, 1000.0)]
    for rank, events in ((1, other), (0, TRACE)):
        path = tmp_path / (f"spec_extend_32768_b1_dp0_pp0_tp{rank}_dcp0_ep0_rank{rank}"
                           ".1764.pt.trace.json")
        path.write_text(json.dumps({"traceEvents": events}))
    (tmp_path / "unrelated.json").write_text("{}")
    assert list(rank_traces(tmp_path)) == [0, 1]
    ranks = rank_summaries(tmp_path, steps=2)
    assert ranks["0"]["gpu_ms_per_step"] == 15.5  # 31 ms of work over 2 steps
    assert ranks["0"]["gpu_ms_per_step_by_category"]["matmul"] == 10.0
    assert ranks["0"]["scope_spans"]["draft"]["median_span_ms"] == 5.0
    draft = ranks["0"]["scope_kernels"]["draft"]
    assert draft["top"][0]["kernel"] == "flash_fwd_kernel"
    assert ranks["1"]["gpu_ms_per_step_by_category"] == {"attention": 0.5}


def test_rank_traces_read_the_fallback_names_of_a_dense_model(tmp_path):
    """A dense model has no expert-parallel group, so vLLM's rank suffix falls
    back to ``rank<global>`` (two H200s, 2026-11-28: ``ranks`` came back
    empty); rank 0's trace is kept gzipped."""
    for rank in (0, 1):
        path = tmp_path / f"spec_extend_32768_b1_rank{rank}.1764.pt.trace.json"
        path.write_text(json.dumps({"traceEvents": TRACE}))
    (tmp_path / "profiler_out_0.txt").write_text("table")
    assert list(rank_traces(tmp_path)) == [0, 1]
    dest = tmp_path / "kept.json.gz"
    keep_rank0_trace(tmp_path, dest)
    assert json.loads(gzip.decompress(dest.read_bytes()))["traceEvents"] == TRACE


def test_window_work_clips_kernels_and_scopes_to_the_window():
    """From 9 to 25 ms: the first matmul ended before it, the last ones start
    after it; the copy straddles the first 5 ms draft span's end, so the span
    holds 1 of its 2 ms; the first draft span ends at the window's start and
    the 1 µs one is too short to count."""
    work = window_work(TRACE, 9000.0, 25000.0)
    idle = work.pop("idle")
    assert work.pop("pageable_copies") == 0
    assert work.pop("host_waits") == {"blocking": {}, "stalls": 0, "stall_ms": 0,
                                      "top": []}
    assert work == {
        "ms": 16.0, "busy_ms": 9.0,
        "kernel_ms_by_category": {"attention": 7.0, "copy": 2.0},
        "scopes": {"draft": {"spans": 2, "span_ms": 10.0, "busy_ms": 8.0}},
    }
    # 16 ms less 9 busy: 1 ms before the first kernel, 1 before the copy,
    # 4.5 after it, 0.5 at the end; no host annotation is open in TRACE.
    assert idle["ms"] == 7.0 and idle["gaps"] == 4
    assert [g["ms"] for g in idle["top"]] == [4.5, 1.0, 1.0, 0.5]
    assert idle["by_host_ms"] == {"(none)": 7.0}
    assert idle["top"][0] == {"at_ms": 7.0, "ms": 4.5, "host": "(none)",
                              "op": "aten::mm", "before": "Memcpy DtoD",
                              "after": "flash_fwd_kernel"}
    # Kernels cut at the window's edges; overlapping streams counted once.
    edge = window_work(TRACE, 41000.0, 43000.0)
    assert edge["busy_ms"] == 2.0
    assert edge["kernel_ms_by_category"] == {"matmul": 2.0, "triton": 1.0}
    assert edge["scopes"]["forward"] == {"spans": 1, "span_ms": 2.0, "busy_ms": 2.0}


def test_idle_gaps_name_the_host_span_the_gpu_waited_on():
    """Gaps under ``min_us`` are work's seams, not waits; each wait is put on
    the innermost host annotation open at its middle, the generate marker
    (which spans every wait) never."""
    work = [((0.0, 100.0), "a"), ((110.0, 200.0), "b"), ((1200.0, 1300.0), "c"),
            ((1250.0, 1500.0), "d"), ((3500.0, 3600.0), "e")]
    events = [
        _ev("user_annotation", GENERATE_MARK, 0.0, 9000.0),
        _ev("user_annotation", "gpu_model_runner: prepare inputs", 150.0, 1000.0),
        _ev("user_annotation", "specextend: pool", 400.0, 300.0),
        _ev("cpu_op", "aten::nonzero", 650.0, 100.0),
    ]
    idle = idle_gaps(events, work, 0.0, 4000.0)
    # 200-1200 (middle 700: the pool's span), 1500-3500 (no span), 3600-4000.
    assert idle["gaps"] == 3 and idle["ms"] == 3.4
    assert idle["by_host_ms"] == {"(none)": 2.4, "specextend: pool": 1.0}
    assert idle["top"][1] == {"at_ms": 0.2, "ms": 1.0, "host": "specextend: pool",
                              "op": "aten::nonzero", "before": "b", "after": "c"}
    assert idle["top"][2]["after"] is None  # the window's end


def test_host_waits_count_blocking_calls_and_launch_stalls():
    """Inside the window only: blocking CUDA calls by name; any call of a
    millisecond or more (a launch that found the queue full) with the host
    span and op open around it."""
    events = [
        _ev("user_annotation", "gpu_model_runner: draft", 0.0, 9000.0),
        _ev("cpu_op", "aten::mm", 1000.0, 3000.0),
        _ev("cuda_runtime", "cudaLaunchKernel", 100.0, 5.0),
        _ev("cuda_runtime", "cudaLaunchKernel", 1500.0, 2500.0),  # a stall
        _ev("cuda_runtime", "cudaStreamSynchronize", 5000.0, 800.0),
        _ev("cuda_driver", "cuMemFree_v2", 6000.0, 10.0),
        _ev("cuda_runtime", "cudaFree", 6100.0, 1200.0),
        _ev("cuda_runtime", "cudaMemcpyAsync", 7400.0, 50.0),  # not blocking by itself
        _ev("cuda_runtime", "cudaStreamSynchronize", 8800.0, 800.0),  # 200 µs inside
        _ev("cuda_runtime", "cudaStreamSynchronize", 9500.0, 800.0),  # past the end
    ]
    waits = window_work(events, 0.0, 9000.0)["host_waits"]
    assert waits["blocking"] == {"cudaFree": {"calls": 1, "ms": 1.2},
                                 "cudaStreamSynchronize": {"calls": 2, "ms": 1.0}}
    assert waits["stalls"] == 2 and waits["stall_ms"] == 3.7
    assert waits["top"][0] == {"at_ms": 1.5, "ms": 2.5, "call": "cudaLaunchKernel",
                               "host": "gpu_model_runner: draft", "op": "aten::mm"}
    assert waits["top"][1]["call"] == "cudaFree" and waits["top"][1]["op"] is None


def test_window_work_counts_copies_from_pageable_memory():
    copies = [_ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 10.0, 5.0),
              _ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 20.0, 5.0),
              _ev("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 90.0, 5.0)]
    assert window_work(copies, 0.0, 50.0)["pageable_copies"] == 1


def test_first_token_window_starts_at_the_generate_marker():
    marker = _ev("user_annotation", GENERATE_MARK, 9000.0, 60000.0)
    # torch's GPU-side annotation of the same name is not the host's start.
    gpu_side = _ev("gpu_user_annotation", GENERATE_MARK, 0.0, 60000.0)
    window = first_token_window([gpu_side, marker, *TRACE], 0.016)
    assert window == window_work(TRACE, 9000.0, 25000.0)
    assert first_token_window(TRACE, 0.016) is None


def test_prefill_tokens_without_prefill_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--target-config", "t", "--prefill-tokens", "64",
              "--out-dir", str(tmp_path)])
    assert exit_.value.code == 2
    assert "--prefill-tokens needs --prefill" in capsys.readouterr().err
