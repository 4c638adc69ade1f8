"""Key re-rotation (rope.shift_keys) against vLLM's own RoPE at the new positions,
and attention with the compacted layout against positions 0..W-1."""

from __future__ import annotations

import pytest
import torch

from vllm_specextend.drafting.rope import exact_ropes, shift_keys

HEAD = 32


def vllm_rope(kind: str, rotary_dim: int, is_neox: bool, max_pos: int = 4096):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    from vllm.model_executor.layers.rotary_embedding.llama3_rope import (
        Llama3RotaryEmbedding,
    )

    args = (HEAD, rotary_dim, max_pos, 10000.0, is_neox, torch.float32)
    with set_current_vllm_config(VllmConfig()):
        if kind == "default":
            return RotaryEmbedding(*args)
        return Llama3RotaryEmbedding(*args, 8.0, 1.0, 4.0, 256)


def rope_keys(rope, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[T, H, D] raw keys -> post-RoPE keys at ``positions`` (vLLM native)."""
    t, h, d = keys.shape
    query = torch.zeros(t, h * d)
    _, out = rope.forward_native(positions, query, keys.reshape(t, h * d).clone())
    return out.view(t, h, d)


def inv_freq(rope) -> torch.Tensor:
    return rope._compute_inv_freq(rope.base)


CASES = [
    ("default", HEAD, True),
    ("default", HEAD, False),
    ("llama3", HEAD, True),
    ("default", HEAD // 2, True),  # partial rotary
    ("llama3", HEAD // 2, False),
]


@pytest.mark.parametrize("kind,rotary_dim,is_neox", CASES)
def test_shift_equals_rope_at_new_position(kind, rotary_dim, is_neox):
    rope = vllm_rope(kind, rotary_dim, is_neox)
    gen = torch.Generator().manual_seed(0)
    n, bs, heads = 5, 8, 2
    raw = torch.randn(n * bs, heads, HEAD, generator=gen)
    start = torch.tensor([0, 64, 800, 1500, 3000])
    delta = torch.tensor([37, 2000, 1, 0, 1000])
    pos = (start[:, None] + torch.arange(bs)).flatten()
    cached = rope_keys(rope, raw, pos).view(n, bs, heads, HEAD)
    want = rope_keys(rope, raw, pos + delta.repeat_interleave(bs))
    got = shift_keys(cached, delta, inv_freq(rope), is_neox)
    torch.testing.assert_close(got.view_as(want), want, atol=1e-3, rtol=1e-3)  # fp32 angles near 4K
    # Partial rotary: the pass-through dimensions are untouched.
    assert torch.equal(got[..., rotary_dim:], cached[..., rotary_dim:])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One query [H, D] over keys/values [T, H, D] (no mask: all visible)."""
    w = torch.softmax(torch.einsum("hd,thd->ht", q, k) / HEAD**0.5, dim=-1)
    return torch.einsum("ht,thd->hd", w, v)


@pytest.mark.parametrize("kind", ["default", "llama3"])
def test_compacted_layout_equals_positions_from_zero(kind):
    """Sinks + chunks re-rotated to just before the window at its real positions
    attend exactly as the same working set at positions 0..W-1."""
    rope = vllm_rope(kind, HEAD, True)
    gen = torch.Generator().manual_seed(1)
    sink, chunk, window_start, ctx = 16, 16, 2400, 2500
    chunks = [160, 1024]  # chunk starts, document order
    original = torch.cat(
        [
            torch.arange(sink),
            *[torch.arange(c, c + chunk) for c in chunks],
            torch.arange(window_start, ctx),
        ]
    )
    w = original.shape[0]
    prefix = sink + chunk * len(chunks)
    offset = window_start - prefix
    raw_k = torch.randn(w, 2, HEAD, generator=gen)
    raw_v = torch.randn(w, 2, HEAD, generator=gen)
    raw_q = torch.randn(1, 2, HEAD, generator=gen)

    # Reference: positions 0..W-1, query at W-1.
    ref_k = rope_keys(rope, raw_k, torch.arange(w))
    ref_q = rope_keys(rope, raw_q, torch.tensor([w - 1]))
    ref = attention(ref_q[0], ref_k, raw_v)

    # Compacted: cached keys at original positions, prefix shifted per token
    # (whole blocks share one delta in the plugin; per token is the same math).
    cached = rope_keys(rope, raw_k, original)
    delta = offset + torch.arange(prefix) - original[:prefix]
    assert (delta >= 0).all()
    k = torch.cat([shift_keys(cached[:prefix], delta, inv_freq(rope), True),
                   cached[prefix:]])
    q = rope_keys(rope, raw_q, torch.tensor([ctx - 1]))
    torch.testing.assert_close(attention(q[0], k, raw_v), ref, atol=1e-4, rtol=1e-4)
    # Without the shift the scores differ (the test is sensitive).
    stale = attention(q[0], cached, raw_v)
    assert (stale - ref).abs().max() > 1e-2


# --- which RoPE types compacted positions accept (rope.exact_ropes) ----------------


def test_exact_ropes_policy():
    from vllm_specextend.config import SpecExtendConfigError

    a, b = object(), object()
    assert exact_ropes([(a, "default"), (b, "llama3")]) == [a, b]
    with pytest.raises(SpecExtendConfigError, match="no rotary embedding"):
        exact_ropes([])
    with pytest.raises(SpecExtendConfigError, match="uses YaRNScalingRotaryEmbedding"):
        exact_ropes([(a, "default"), (b, "YaRNScalingRotaryEmbedding")])


def test_rotary_embeddings_are_named_by_variant():
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import (
        DynamicNTKScalingRotaryEmbedding,
    )

    from vllm_specextend import compat

    default = vllm_rope("default", HEAD, True)
    with set_current_vllm_config(VllmConfig()):
        ntk = DynamicNTKScalingRotaryEmbedding(
            HEAD, HEAD, 4096, 2048, 10000.0, True, 2.0, torch.float32
        )
    model = torch.nn.ModuleList([
        torch.nn.ModuleDict({"rope": default}), torch.nn.ModuleDict({"rope": default}),
        torch.nn.ModuleDict({"rope": vllm_rope("llama3", HEAD, True)}),
    ])
    found = compat.rotary_embeddings(model)
    assert [name for _, name in found] == ["default", "llama3"], "each module once"
    assert exact_ropes(found) == [m for m, _ in found]
    model.append(ntk)
    assert compat.rotary_embeddings(model)[-1][1] == "DynamicNTKScalingRotaryEmbedding"
    with pytest.raises(ValueError, match="DynamicNTKScalingRotaryEmbedding"):
        exact_ropes(compat.rotary_embeddings(model))


@pytest.mark.parametrize("kind", ["default", "llama3"])
def test_extend_rope_matches_a_longer_table_and_undoes(kind):
    from vllm_specextend import compat
    from vllm_specextend.compat.patches import DRAFT_ROPE_TABLE

    short, long = vllm_rope(kind, HEAD, True, 256), vllm_rope(kind, HEAD, True, 1024)
    table = short.cos_sin_cache
    compat.extend_rope(short, 512)
    compat.extend_rope(short, 1024)  # longer again: replaces the first extension
    compat.extend_rope(short, 300)  # already long enough
    assert short.max_position_embeddings == 1024
    torch.testing.assert_close(short.cos_sin_cache, long.cos_sin_cache)
    assert "cos_sin_cache" in short._buffers
    compat.REGISTRY.undo(DRAFT_ROPE_TABLE, short)
    assert short.max_position_embeddings == 256 and short.cos_sin_cache is table
