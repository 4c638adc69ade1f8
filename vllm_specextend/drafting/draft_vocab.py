"""The draft's vocabulary cut (``spec_extend.draft_vocab: N``): greedy drafts
choose among the first N token ids only.

Why: a small draft's ``lm_head`` is its widest product (a 1B draft's over
128K ids, four times a step at K=4), and BPE vocabularies number tokens in
merge order, roughly by frequency, so the first N rows hold most of what a
draft proposes (``docs/design.md``, "Where the rest goes"). The cut is a view
of those rows; the proposer's ``_greedy_sample`` takes its logits, eagerly and
in the captured routine. Sampled drafts keep the whole vocabulary, and the
target verifies every token: a cut changes acceptance, never the output.
"""

from __future__ import annotations

import torch

from vllm_specextend import compat
from vllm_specextend.config import SpecExtendConfig, SpecExtendConfigError


def vocab_rows(drafter, cfg: SpecExtendConfig) -> torch.Tensor | None:
    """``[draft_vocab, hidden]``: the drafter's ``lm_head`` rows greedy
    drafts choose from (``cfg.draft_vocab``); None for the whole
    vocabulary, or before the drafter is loaded."""
    model = getattr(drafter, "model", None)
    if cfg.draft_vocab is None or model is None:
        return None
    if drafter.use_local_argmax_reduction or drafter.use_heterogeneous_vocab:
        raise SpecExtendConfigError(
            "spec_extend.draft_vocab cannot cut a drafter whose vocabulary "
            "vLLM maps or reduces per rank (a draft with another tokenizer, "
            "or local argmax reduction); leave draft_vocab unset."
        )
    return compat.lm_head_rows(model, cfg.draft_vocab)
