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

This module also owns the policy of which RoPE types that holds for
(:func:`exact_ropes`); ``compat.rotary_embeddings`` only finds and names them.

Pure torch; no vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_specextend.config import SpecExtendConfigError

EXACT_ROPE_SCALINGS = ("default", "llama3")
"""RoPE variants whose inverse frequencies do not depend on the sequence
length, so a longer cos/sin table and re-rotation by a delta are exact."""


def exact_ropes(ropes: Sequence[tuple[object, str]]) -> list:
    """The modules of ``ropes``, (module, scaling) pairs, once every one is a
    variant compacted positions can re-rotate exactly."""
    _raise_if_no_rope(ropes)
    _raise_if_inexact(ropes)
    return [module for module, _ in ropes]


def _raise_if_no_rope(ropes: Sequence[tuple[object, str]]) -> None:
    if not ropes:
        raise SpecExtendConfigError(
            "spec_extend.compact_positions needs a RoPE draft; this draft has no "
            "rotary embedding. Set compact_positions to false."
        )


def _raise_if_inexact(ropes: Sequence[tuple[object, str]]) -> None:
    for _, scaling in ropes:
        if scaling not in EXACT_ROPE_SCALINGS:
            raise SpecExtendConfigError(
                "spec_extend.compact_positions supports default and llama3 RoPE, "
                f"but the draft uses {scaling}. Set compact_positions to false "
                "and use a draft whose max_model_len covers the context."
            )


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
    # [n, rotary_dim // 2]
    angle = delta.to(torch.float32)[:, None] * inv_freq.to(keys.device)[None, :]
    shape = (keys.shape[0],) + (1,) * (keys.dim() - 2) + (rotary_dim // 2,)
    # [n, 1, ..., rotary_dim // 2]: broadcast over the middle dimensions
    cos, sin = angle.cos().view(shape), angle.sin().view(shape)
    # [n, ..., rotary_dim] fp32
    rotated = rotate(keys[..., :rotary_dim].float(), cos, sin, is_neox)
    return torch.cat((rotated.to(keys.dtype), keys[..., rotary_dim:]), dim=-1)
