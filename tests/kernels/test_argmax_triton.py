"""GPU: the Triton argmax equals ``torch.argmax`` index for index, ties included."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, vocab", [(1, 128256), (5, 128256), (32, 32000),
                                         (3, 1000), (2, 64), (4, 65)])
def test_matches_torch(rows, vocab, dtype):
    from vllm_specextend.drafting.argmax_triton import argmax_triton

    gen = torch.Generator(device="cuda").manual_seed(rows * vocab)
    for _ in range(5):  # fresh inputs each time
        logits = torch.randn(rows, vocab, device="cuda", generator=gen).to(dtype)
        assert torch.equal(argmax_triton(logits), logits.argmax(dim=-1))


def test_ties_go_to_the_first_index():
    from vllm_specextend.drafting.argmax_triton import argmax_triton

    logits = torch.zeros(4, 128256, device="cuda", dtype=torch.bfloat16)
    logits[0, [7, 90000]] = 3.0  # across parts
    logits[1, [70000, 70001]] = 2.0  # inside one part
    logits[2] = -1.0  # all equal
    logits[3, -1] = 5.0  # the last entry
    assert argmax_triton(logits).tolist() == [7, 70000, 0, 128255]
    assert torch.equal(argmax_triton(logits), logits.argmax(dim=-1))


def test_strided_rows():
    from vllm_specextend.drafting.argmax_triton import argmax_triton

    wide = torch.randn(6, 4096, device="cuda")
    view = wide[::2, :3000]  # last dim contiguous, row stride 8192
    assert torch.equal(argmax_triton(view), view.argmax(dim=-1))
