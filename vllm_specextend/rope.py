"""Re-rotating cached keys to new positions (compacted draft positions).

vLLM caches keys after RoPE. RoPE rotates each frequency pair of a key at
position p by the angle ``p * inv_freq``; rotations compose, so a key cached at
p becomes the key at ``p + delta`` after one more rotation by ``delta *
inv_freq``. That holds for any fixed inverse frequencies, including Llama-3's
scaled ones, but not for RoPE types whose frequencies depend on the sequence
length (dynamic NTK, YaRN and friends), which the plugin refuses.

Attention scores under RoPE depend only on position differences. So if the
draft's working set (sinks, selected chunks, recent window, new tokens) sits at
contiguous positions ``offset + 0 .. offset + W - 1``, the draft computes the
same attention as with positions ``0 .. W - 1``: the window and new tokens keep
their real positions, and only the sink and chunk keys are re-rotated to sit
right before the window.

Pure torch; no vLLM.
"""

from __future__ import annotations

import torch


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool):
    """Rotate the pairs of ``x`` [..., rotary_dim] by angles given as
    ``cos``/``sin`` [..., rotary_dim // 2] (broadcast). Neox style pairs the two
    halves, GPT-J style adjacent elements, as vLLM's ``ApplyRotaryEmb``."""
    if is_neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def shift_keys(
    keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor, is_neox: bool
) -> torch.Tensor:
    """Keys cached at positions p, as if cached at ``p + delta``.

    keys: [n, ..., head_size] post-RoPE; delta: [n] int (one shift per leading
    index, e.g. per KV block); inv_freq: [rotary_dim // 2] fp32. Dimensions past
    ``rotary_dim`` (partial rotary) pass through. Computed in fp32.
    """
    rotary_dim = 2 * inv_freq.shape[0]
    angle = delta.to(torch.float32)[:, None] * inv_freq.to(keys.device)[None, :]
    shape = (keys.shape[0],) + (1,) * (keys.dim() - 2) + (rotary_dim // 2,)
    cos, sin = angle.cos().view(shape), angle.sin().view(shape)
    rotated = rotate(keys[..., :rotary_dim].float(), cos, sin, is_neox)
    return torch.cat((rotated.to(keys.dtype), keys[..., rotary_dim:]), dim=-1)
