"""The benchmark harness's pure parts: the figures (``measure``), the GPU busy
share over a decode window (``gpu_busy``, from hand-made samples), how each
mode differs from plain decoding (``modes``) and the device a result names
(``meta``)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from waiting import wait_for

from benchmarks.harness import measure, modes
from benchmarks.harness.gpu_busy import GpuBusy, nvml_devices
from benchmarks.harness.meta import device


def test_spread():
    assert measure.spread([3.0, 1.0, 2.0]) == {"min": 1.0, "median": 2.0, "max": 3.0,
                                               "n": 3}
    assert measure.spread([]) == {"min": None, "median": None, "max": None, "n": 0}


def test_covered_seconds_counts_overlaps_once():
    assert measure.covered_seconds([(0, 2), (1, 3), (5, 6), (5.5, 5.8)]) == 4
    assert measure.covered_seconds([]) == 0


def test_decode_throughput_leaves_out_first_tokens_and_waits():
    # Request b decodes from 3 to 4 while a has finished: 1 s of waiting for
    # b's first token (2 to 3) is not decode time.
    out = measure.decode_throughput([(0.0, 2.0, 5), (3.0, 4.0, 3)])
    assert out == {"decode_s": 3.0, "decode_tokens": 6, "decode_tok_s": 2.0}
    assert measure.decode_throughput([(1.0, 1.0, 1)])["decode_tok_s"] is None


def test_burst_shape_splits_the_window_at_the_last_first_token():
    # Three requests of a burst: first tokens at 1, 2 and 5 (the spread, 4 s),
    # the last of them decodes for 3 s; the first one ends latest.
    requests = [(1.0, 9.0, 10), (2.0, 4.0, 10), (5.0, 8.0, 10)]
    assert measure.burst_shape(requests) == {
        "first_token_spread_s": 4.0, "last_request_decode_s": 3.0}
    assert measure.burst_shape([]) == {
        "first_token_spread_s": None, "last_request_decode_s": None}


def test_gpu_busy_share_counts_the_samples_inside_the_intervals():
    busy = GpuBusy()
    busy.samples = [(0.0, [0.1]), (1.0, [0.9]), (2.0, [0.7]), (3.0, [0.2]),
                    (4.0, [1.0]), (5.0, [0.0])]
    # Interval ends count; 0.0, 3.0 and 5.0 lie outside both intervals.
    assert busy.share([(1.0, 2.0), (3.5, 4.5)]) == pytest.approx((0.9 + 0.7 + 1.0) / 3)
    # Overlapping intervals (concurrent requests) count a sample once.
    assert busy.share([(0.5, 2.5), (1.5, 3.0)]) == pytest.approx((0.9 + 0.7 + 0.2) / 3)
    assert busy.share([(5.5, 9.0)]) is None
    assert busy.share([]) is None
    busy.samples = []  # no NVML (CPU), or a window shorter than a sample period
    assert busy.share([(0.0, 9.0)]) is None


class _FakeNvml:
    """Device 0 at 50%, device 1 at 100%."""

    @staticmethod
    def nvmlDeviceGetUtilizationRates(handle):
        return SimpleNamespace(gpu=50 if handle == 0 else 100)


def test_gpu_busy_stamps_samples_with_its_clock_and_averages_devices():
    ticks = itertools.count(100)
    busy = GpuBusy(interval_s=0.001, clock=lambda: float(next(ticks)))
    busy._nvml, busy._handles = _FakeNvml(), [0, 1]  # NVML without a GPU
    with busy:  # until the sampler has taken two samples, however slowly
        wait_for(lambda: len(busy.samples), lambda n: n >= 2, "two samples")
    assert busy.samples[:2] == [(100.0, [0.5, 1.0]), (101.0, [0.5, 1.0])]
    assert busy.share([(100.0, 101.0)]) == 0.75
    # Tensor parallel: each GPU's own share, so the least busy one shows.
    assert busy.per_device([(100.0, 101.0)]) == [0.5, 1.0]
    # No sample after the last one: a slow machine's sampler may have taken
    # a hundred before the block ended (CI, 2026-11-28), so not a fixed window.
    last = busy.samples[-1][0]
    assert busy.per_device([(last + 1, last + 100)]) is None


def test_percentile_interpolates_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert measure.percentile(values, 50) == 2.5
    assert measure.percentile(values, 99) == pytest.approx(3.97)
    assert measure.percentile([], 50) is None


def test_each_mode_adds_only_its_settings():
    spec = modes.Speculation(draft="D", num_spec_tokens=3, acceptance_length=2.5,
                             spec_extend={"top_k": 8})
    assert modes.engine_settings("plain", spec) == {}
    speculative = {"method": "draft_model", "model": "D", "num_speculative_tokens": 3,
                   "rejection_sample_method": "synthetic",
                   "synthetic_acceptance_length": 2.5}
    assert modes.engine_settings("draft_model", spec) == {
        "speculative_config": speculative}
    assert modes.engine_settings("spec_extend", spec) == {
        "speculative_config": speculative,
        "additional_config": {"spec_extend": {"top_k": 8}}}
    # self_draft: K and the acceptance, no draft model (the plugin adds it).
    assert modes.engine_settings("self_draft", spec) == {
        "speculative_config": {k: v for k, v in speculative.items()
                               if k not in ("method", "model")},
        "additional_config": {"spec_extend": {"top_k": 8, "self_draft": True}}}
    assert modes.serve_flags(modes.engine_settings("spec_extend", spec))[2:] == [
        "--spec-extend", '{"top_k": 8}']
    assert modes.label("draft_model", modes.Speculation(method="eagle3")) == "eagle3"
    with pytest.raises(ValueError, match="needs a draft model"):
        modes.engine_settings("draft_model", modes.Speculation())


def test_plugin_modes_are_refused_where_the_plugin_is_not_installed(monkeypatch):
    import importlib.metadata

    # This checkout's venv has the plugin installed (its entry point).
    assert modes.plugin_gap(["plain", "spec_extend", "self_draft"]) is None
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    assert modes.plugin_gap(["plain", "draft_model"]) is None
    for mode in modes.PLUGIN_MODES:
        assert "entry point is missing" in modes.plugin_gap(["plain", mode])


def test_a_server_failure_report_names_argparse_refusals(tmp_path):
    from benchmarks.harness.server import tail

    log = tmp_path / "serve.log"
    log.write_text("usage: main.py [-h] [-v]\n"
                   "main.py: error: unrecognized arguments: --spec-extend {}\n")
    report = tail(log)
    refusal = "main.py: error: unrecognized arguments: --spec-extend {}"
    assert report.splitlines()[0] == refusal
    assert report.splitlines()[1] == f"last lines of {log}:"


def test_device_reads_every_metadata_block():
    assert device({"hardware": {"device": "H100"}, "config": {}}) == "H100"
    assert device({"gpu": "NVIDIA H200",
                   "config": {"tensor_parallel_size": 2}}) == "NVIDIA H200 ×2 (TP=2)"
    assert device({"hardware": {"gpus": ["NVIDIA H100 80GB HBM3, 81559 MiB, 580"],
                                "cpu": "x"}, "config": {}}) == "NVIDIA H100 80GB HBM3"
    assert device({"gpu": "cpu", "config": {}}) == "CPU"


def test_gpu_busy_reads_the_gpus_the_process_sees():
    # NVML ignores CUDA_VISIBLE_DEVICES: a bench on a host's second GPU must
    # sample NVML's device 1, not 0.
    assert nvml_devices([0], visible="1") == [1]
    assert nvml_devices([0, 1], visible="3,2") == [3, 2]
    assert nvml_devices([0], visible="GPU-8f2c") == ["GPU-8f2c"]
    assert nvml_devices([0, 1], visible="") == [0, 1]
    with pytest.raises(ValueError, match="not visible"):
        nvml_devices([1], visible="0")
