"""The prototype view-attention kernel (benchmarks/gpu/view_attention_triton.py)
against plain torch, on CPU through Triton's interpreter: paged keys through a
block table, grouped heads, several new tokens with bottom-right causal
masking, splits with no keys, and calls one after another on the same
buffers (the combining program resets its counter)."""

from __future__ import annotations

import importlib

import pytest
import torch

# Triton's interpreter warns on every scalar it converts (NumPy 1.25).
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def kernel():
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")  # read when the kernel is decorated
    import benchmarks.gpu.view_attention_triton as module

    yield importlib.reload(module)
    mp.undo()
    importlib.reload(module)


def case(seq_lens, q_lens, num_kv_heads=2, group=4, head_dim=32, block_size=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    max_blocks = max(-(-n // block_size) for n in seq_lens)
    num_blocks = len(seq_lens) * max_blocks + 3
    k = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=gen)
    # every request's blocks scattered over the cache, as a view's are
    table = torch.randperm(num_blocks, generator=gen)[:len(seq_lens) * max_blocks]
    table = table.view(len(seq_lens), max_blocks).to(torch.int32)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(starts[-1]), num_kv_heads * group, head_dim, generator=gen)
    return q, k, v, table, torch.tensor(seq_lens, dtype=torch.int32), starts


@pytest.mark.parametrize("seq_lens, q_lens, splits", [
    ([37], [1], 4),            # a tile and a part; two splits with no keys
    ([200, 5, 64], [1, 1, 1], 4),
    ([130, 77], [5, 3], 8),    # the first draft forward: several new tokens
    ([1], [1], 2),
])
def test_matches_torch(kernel, seq_lens, q_lens, splits):
    q, k, v, table, lens, starts = case(seq_lens, q_lens)
    attn = kernel.ViewAttention(len(seq_lens), q.shape[1], k.shape[2], q.shape[2],
                                max_query_len=max(q_lens), num_splits=splits,
                                block_n=16, device="cpu")
    want = kernel.reference(q, k, v, table, lens, starts, scale=0.17)
    for _ in range(2):  # the second call reuses the counters the first reset
        got = attn(q, k, v, table, lens, starts, scale=0.17)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert int(attn.counter.abs().sum()) == 0


def test_a_wrong_key_would_be_seen(kernel):
    # The test can fail: a key changed inside the view changes the output,
    # one outside it (a block the table does not list) does not.
    q, k, v, table, lens, starts = case([40], [1])
    attn = kernel.ViewAttention(1, q.shape[1], k.shape[2], q.shape[2], num_splits=2,
                                block_n=16, device="cpu")
    base = attn(q, k, v, table, lens, starts, scale=0.2).clone()
    unused = sorted(set(range(k.shape[0])) - set(table.flatten().tolist()))[0]
    k2 = k.clone()
    k2[unused] += 5.0
    torch.testing.assert_close(attn(q, k2, v, table, lens, starts, scale=0.2), base)
    k2[int(table[0, 1]), 3] += 5.0  # key 19 of the request
    assert not torch.allclose(attn(q, k2, v, table, lens, starts, scale=0.2), base)
