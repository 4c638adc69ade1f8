"""The prefill floor bench's arithmetic (its timings need a GPU): chunks cover
the prompt once, and a chunked prompt's attention FLOPs equal the whole
causal prompt's, so chunking adds no work to the floor it reports."""

import json

import pytest

pytest.importorskip("triton")  # the bench shares skinny_gemm_bench's bandwidth probe

from benchmarks.gpu.prefill_floor_bench import (attention_flops, chunk_bounds,
                                                gemm_shapes, shape)


def test_chunks_cover_the_prompt_once():
    assert chunk_bounds(32768, 8192) == [(0, 8192), (8192, 8192), (16384, 8192), (24576, 8192)]
    assert chunk_bounds(20000, 8192) == [(0, 8192), (8192, 8192), (16384, 3616)]


def test_chunked_attention_flops_equal_the_whole_prompts():
    s = {"heads": 32, "head_dim": 128}
    whole = attention_flops(s, 0, 32768)
    chunked = sum(attention_flops(s, a, n) for a, n in chunk_bounds(32768, 8192))
    assert chunked == pytest.approx(whole)
    # One query over one key: QK^T and PV, a multiply and an add each, per head dim.
    assert attention_flops(s, 0, 1) == 2 * 2 * 32 * 128


def test_shape_and_projections_of_an_8b_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "num_hidden_layers": 32}))
    s = shape(tmp_path)
    assert s["head_dim"] == 128
    proj = gemm_shapes(s)
    assert proj == {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672),
                    "down": (14336, 4096)}
    # 6.98 B linear parameters a layer stack: the 8B without its embeddings.
    assert sum(i * o for i, o in proj.values()) * 32 == pytest.approx(6.98e9, rel=0.01)


def test_window_view_reads_sinks_window_and_chunk():
    from benchmarks.gpu.prefill_floor_bench import window_view
    # The first chunk has nothing before it to drop; no window reads everything.
    assert window_view(0, 8192, 2048, 32) == (0, 8192)
    assert window_view(8192, 8192, None, 32) == (0, 16384)
    # Past it: 32 sink tokens (2 blocks), then whole blocks from start - 2048.
    first, used = window_view(8192, 8192, 2048, 32)
    assert first == (8192 - 2048) // 16
    assert used == 32 + 2048 + 8192
    # A window that reaches back into the sinks drops nothing.
    assert window_view(2048, 8192, 2048, 32) == (0, 10240)
