"""deferral.PrefillDeferral: kept passes own copies of their inputs, in order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_specextend.deferral import PrefillDeferral, copy_metadata


@dataclass
class _Metadata:  # the shape of vLLM's CommonAttentionMetadata: tensors, arrays, ints
    seq_lens: torch.Tensor
    block_table_tensor: torch.Tensor
    host_lens: np.ndarray
    num_reqs: int
    optional: torch.Tensor | None = None


def _metadata():
    return _Metadata(torch.tensor([5, 7]), torch.arange(8).view(2, 4),
                     np.array([5, 7]), 2)


def test_copies_survive_the_runner_rewriting_its_buffers():
    cad = _metadata()
    copied = copy_metadata(cad)
    cad.seq_lens.fill_(0)
    cad.block_table_tensor.fill_(-1)
    cad.host_lens[:] = 0

    assert copied.seq_lens.tolist() == [5, 7]
    assert copied.block_table_tensor.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert copied.host_lens.tolist() == [5, 7]
    assert copied.num_reqs == 2 and copied.optional is None


def test_passes_are_taken_oldest_first_and_named_by_request():
    deferral = PrefillDeferral()
    tokens = torch.arange(4)
    deferral.keep(["a"], tokens, tokens, tokens[:1], _metadata())
    tokens.fill_(9)  # the runner's buffer, rewritten
    deferral.keep(["a", "b"], tokens, tokens, tokens[:2], _metadata())

    assert len(deferral) == 2
    assert deferral.holds_any({"b", "c"}) and not deferral.holds_any({"c"})
    first, second = deferral.take()
    assert first.token_ids.tolist() == [0, 1, 2, 3]
    assert second.req_ids == {"a", "b"} and second.token_ids.tolist() == [9] * 4
    assert len(deferral) == 0 and not deferral.holds_any({"a"})
