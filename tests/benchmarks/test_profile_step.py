"""``benchmarks.gpu.profile_step``'s reading of vLLM's runner scopes."""

from __future__ import annotations

from types import SimpleNamespace

from benchmarks.gpu.profile_step import category, runner_scopes


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
