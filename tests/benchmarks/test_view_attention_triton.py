"""The prototype view-attention kernel (benchmarks/gpu/view_attention_triton.py)
against plain torch, on CPU through Triton's interpreter: paged keys through a
block table, grouped heads, several new tokens with bottom-right causal
masking, splits with no keys, and calls one after another on the same
buffers (the combining program resets its counter).

The kernel runs in a fresh interpreter: Triton decides at decoration time
whether to interpret (``TRITON_INTERPRET``), and in the full suite earlier
tests have set up torch, Triton and vLLM in this process already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from benchmarks.harness.meta import REPO_ROOT

CASES = [
    # (seq_lens, q_lens, splits)
    ([37], [1], 4),            # a tile and a part; two splits with no keys
    ([200, 5, 64], [1, 1, 1], 4),
    ([130, 77], [5, 3], 8),    # the first draft forward: several new tokens
    ([1], [1], 2),
]

SCRIPT = textwrap.dedent("""\
    import json, sys
    import torch
    from benchmarks.gpu.view_attention_triton import ViewAttention, reference

    def case(seq_lens, q_lens, num_kv_heads=2, group=4, head_dim=32, block_size=16):
        gen = torch.Generator().manual_seed(0)
        max_blocks = max(-(-n // block_size) for n in seq_lens)
        num_blocks = len(seq_lens) * max_blocks + 3
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        k = torch.randn(*shape, generator=gen)
        v = torch.randn(*shape, generator=gen)
        # every request's blocks scattered over the cache, as a view's are
        table = torch.randperm(num_blocks, generator=gen)[:len(seq_lens) * max_blocks]
        table = table.view(len(seq_lens), max_blocks).to(torch.int32)
        starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()],
                              dtype=torch.int32)
        q = torch.randn(int(starts[-1]), num_kv_heads * group, head_dim, generator=gen)
        return q, k, v, table, torch.tensor(seq_lens, dtype=torch.int32), starts

    out = {"cases": []}
    for seq_lens, q_lens, splits in json.loads(sys.argv[1]):
        q, k, v, table, lens, starts = case(seq_lens, q_lens)
        attn = ViewAttention(len(seq_lens), q.shape[1], k.shape[2], q.shape[2],
                             max_query_len=max(q_lens), num_splits=splits, block_n=16,
                             device="cpu")
        want = reference(q, k, v, table, lens, starts, scale=0.17)
        errors = []
        for _ in range(2):  # the second call reuses the counters the first reset
            got = attn(q, k, v, table, lens, starts, scale=0.17)
            errors.append(float((got - want).abs().max()))
        out["cases"].append({"errors": errors, "counters": int(attn.counter.abs().sum())})

    # A key changed inside the view changes the output; one in a block the
    # table does not list does not.
    q, k, v, table, lens, starts = case([40], [1])
    attn = ViewAttention(1, q.shape[1], k.shape[2], q.shape[2], num_splits=2, block_n=16,
                         device="cpu")
    base = attn(q, k, v, table, lens, starts, scale=0.2).clone()
    unused = sorted(set(range(k.shape[0])) - set(table.flatten().tolist()))[0]
    k2 = k.clone()
    k2[unused] += 5.0
    out["unused_block_change"] = float(
        (attn(q, k2, v, table, lens, starts, scale=0.2) - base).abs().max())
    k2[int(table[0, 1]), 3] += 5.0  # key 19 of the request
    out["view_key_change"] = float(
        (attn(q, k2, v, table, lens, starts, scale=0.2) - base).abs().max())
    print(json.dumps(out))
    """)


@pytest.fixture(scope="module")
def checked():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT),
           "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES)], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("index", range(len(CASES)), ids=[str(c) for c in CASES])
def test_matches_torch(checked, index):
    result = checked["cases"][index]
    assert max(result["errors"]) < 1e-4, result
    assert result["counters"] == 0


def test_a_wrong_key_would_be_seen(checked):
    # The test can fail: only keys the block table lists reach the output.
    assert checked["unused_block_change"] == 0.0
    assert checked["view_key_change"] > 1e-3
