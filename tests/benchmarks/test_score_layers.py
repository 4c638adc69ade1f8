"""The scoring-layer probe (benchmarks/longinput/score_layers.py): its chunk masses are
the model's own attention, and ranks and shares count what they claim."""

from __future__ import annotations

import pytest
import torch

from benchmarks.longinput.score_layers import (
    Capture,
    chunk_mass,
    needle_rank,
    summarize,
)


def test_needle_rank_counts_stronger_candidates_only():
    mass = torch.tensor([9.0, 0.1, 0.5, 0.3, 0.4, 8.0])
    # Candidates 1..4: the sink (0) and the window (5) are outside.
    assert needle_rank(mass, [2], 1, 5) == 0
    assert needle_rank(mass, [3], 1, 5) == 2  # below 0.5 and 0.4
    assert needle_rank(mass, [1, 4], 1, 5) == 1  # the better of the two counts


def test_chunk_mass_sums_probabilities_per_chunk_and_averages_heads():
    torch.manual_seed(0)
    query, keys = torch.randn(2, 8), torch.randn(2, 10, 8)
    probs = torch.softmax(torch.einsum("hd,htd->ht", query, keys) / 8 ** 0.5, -1)
    mass = chunk_mass(query, keys, 4, 8 ** -0.5)
    assert mass.shape == (3,)  # 10 tokens: chunks of 4, 4, 2
    torch.testing.assert_close(mass[0], probs[:, :4].sum(-1).mean())
    torch.testing.assert_close(mass[2], probs[:, 8:].sum(-1).mean())
    torch.testing.assert_close(mass.sum(), torch.tensor(1.0))


def test_captured_queries_and_keys_give_the_models_attention(tiny_target):
    # The capture holds post-RoPE queries and keys: their softmax is the
    # attention the model itself computes (eager, output_attentions).
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_target, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = torch.arange(5, 75)[None]
    with torch.no_grad():
        eager = model(tokens, output_attentions=True).attentions
    capture = Capture()
    capture.install(model)
    capture.rows = 3
    with torch.no_grad():
        model(tokens)
    group = model.config.num_attention_heads // model.config.num_key_value_heads
    assert sorted(capture.layers) == list(range(model.config.num_hidden_layers))
    for layer, (q, k, scale, window) in capture.layers.items():
        assert window is None
        for row in range(3):
            position = tokens.shape[1] - 3 + row
            keys = k[:, : position + 1].repeat_interleave(group, 0)
            expected = eager[layer][0, :, position, : position + 1].mean(0)
            torch.testing.assert_close(chunk_mass(q[:, row], keys, 1, scale), expected,
                                       atol=1e-5, rtol=1e-4)


def test_summarize_skips_sliding_window_layers():
    rows = [{"correct": True, "first_digit_query": 0, "ranks": [[0, None, 3]]}]
    assert [t["layer"] for t in summarize(rows, [1])] == [0, 2]


def test_summarize_shares_per_layer():
    rows = [
        {"correct": True, "first_digit_query": 1, "ranks": [[0, 5], [2, 0], [0, 0]]},
        {"correct": False},
        {"correct": True, "first_digit_query": 0, "ranks": [[4, 0]]},
    ]
    table = summarize(rows, [1, 3])
    assert [t["layer"] for t in table] == [0, 1]
    assert table[0]["all_top1"] == 0.5 and table[0]["all_top3"] == 0.75
    assert table[1]["all_top1"] == 0.75
    # Before the first digit: case 1's query 1 ([2, 0]) and case 2's query 0 ([4, 0]).
    assert table[0]["pre_digit_top3"] == 0.5 and table[1]["pre_digit_top1"] == 1.0
