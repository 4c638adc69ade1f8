"""Finding vLLM's layers: attention layers by name, rotary embeddings by type.

What SpecExtend does with them (which RoPE types it can re-rotate exactly,
which layer it scores with) is decided by the modules that own the policy
(``rope``, the proposer); this module only finds and names them.
"""

from __future__ import annotations

import torch


def attention_layer(vllm_config, name: str):
    """The attention layer registered as ``name`` in the static forward context."""
    return vllm_config.compilation_config.static_forward_context[name]


def target_attention(vllm_config, exclude: set[str], cfg):
    """(index, count, layer): the target's attention layer ``cfg.score_layer``
    (a Python index into its ``count`` attention layers in model order; -1:
    the final one), ``index`` resolved to 0..count-1. ``exclude``: the draft's
    own layers, which share the forward context."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.models.utils import extract_layer_index

    from vllm_specextend.config import SpecExtendConfigError, score_layer_index

    layers = {
        name: layer
        for name, layer in get_layers_from_vllm_config(vllm_config, Attention).items()
        if name not in exclude
    }
    if not layers:
        raise RuntimeError("vllm-specextend found no target attention layer.")
    names = sorted(layers, key=extract_layer_index)
    index = score_layer_index(cfg, len(names))
    layer = layers[names[index]]
    # vLLM frees a sliding-window layer's blocks behind its window (and may
    # keep them in a KV group of their own): its keys cannot rank the context.
    if getattr(layer, "sliding_window", None) is not None:
        raise SpecExtendConfigError(
            f"spec_extend.score_layer={cfg.score_layer} is {names[index]}, a "
            f"sliding-window layer ({layer.sliding_window} tokens); choose a "
            "full-attention layer."
        )
    return index, len(names), layer


def kv_cache_layer_names(vllm_config) -> set[str]:
    """Names of the attention layers that own KV cache (the target's, when no
    draft model is loaded)."""
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase)
    return {
        name
        for name, layer in layers.items()
        if layer.get_kv_cache_spec(vllm_config) is not None
    }


def rotary_embeddings(model) -> list[tuple[object, str]]:
    """(module, scaling) of each distinct rotary embedding in ``model``.

    ``scaling`` names the RoPE variant as Hugging Face's ``rope_type`` does:
    ``"default"`` for vLLM's plain ``RotaryEmbedding``, ``"llama3"`` for
    ``Llama3RotaryEmbedding``, else the vLLM class name (YaRN, dynamic NTK...).
    """
    from vllm.model_executor.layers.rotary_embedding.base import (
        RotaryEmbedding,
        RotaryEmbeddingBase,
    )
    from vllm.model_executor.layers.rotary_embedding.llama3_rope import (
        Llama3RotaryEmbedding,
    )

    names = {RotaryEmbedding: "default", Llama3RotaryEmbedding: "llama3"}
    ropes = {id(m): m for m in model.modules() if isinstance(m, RotaryEmbeddingBase)}
    return [(m, names.get(type(m), type(m).__name__)) for m in ropes.values()]


def rope_inv_freq(rope) -> torch.Tensor:
    """``[rotary_dim // 2]`` fp32 inverse frequencies (Llama-3 scaling included).

    vLLM 0.26: ``_compute_inv_freq(base)`` is how every RoPE class builds its
    cos/sin table, scaling included.
    """
    return rope._compute_inv_freq(rope.base)


def lm_head_rows(model, rows: int) -> torch.Tensor:
    """``[rows, hidden]``: the first ``rows`` rows of ``model``'s output
    projection, a view of its weight (``draft_vocab``). vLLM 0.26's
    ``ParallelLMHead`` (tied or not) keeps a ``[vocab_padded, hidden]`` weight
    on each TP rank, its logits are ``hidden @ weight.T`` for an unquantized
    head, then cut to the vocabulary, soft-capped and scaled (each
    order-preserving, so the argmax over these rows is the argmax over those
    token ids)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
    )

    from vllm_specextend.config import SpecExtendConfigError

    head = getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if weight is None:
        raise SpecExtendConfigError(
            "spec_extend.draft_vocab: the drafter has no output projection "
            "(lm_head) to cut; leave draft_vocab unset."
        )
    if getattr(head, "tp_size", 1) > 1:
        raise SpecExtendConfigError(
            "spec_extend.draft_vocab needs the drafter's lm_head on one GPU: "
            f"it is split over {head.tp_size} tensor-parallel ranks; leave "
            "draft_vocab unset."
        )
    if not isinstance(getattr(head, "quant_method", None), UnquantizedEmbeddingMethod):
        raise SpecExtendConfigError(
            "spec_extend.draft_vocab needs an unquantized lm_head "
            f"({type(head.quant_method).__name__} here); leave draft_vocab unset."
        )
    vocab = getattr(head, "org_vocab_size", weight.shape[0])
    if rows > vocab:
        raise SpecExtendConfigError(
            f"spec_extend.draft_vocab={rows} exceeds the drafter's vocabulary "
            f"({vocab} tokens); use at most {vocab}."
        )
    return weight[:rows]
