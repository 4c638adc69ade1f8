"""GPU tests: Triton ``block_lse_triton`` against the torch reference ``block_lse_torch``."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernel needs CUDA"),
]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
NUM_BLOCKS = 9
GARBAGE_COLS = 3  # table columns past num_blocks, never valid


@pytest.fixture(scope="module")
def impls():
    # Imported lazily so collection works without CUDA/Triton.
    from vllm_specextend.retrieval.scoring import block_lse_torch
    from vllm_specextend.retrieval.scoring_triton import block_lse_triton
    return block_lse_triton, block_lse_torch


def _ctx_lens(bs: int, num_blocks: int) -> list[int]:
    # 1 token, ragged (not a multiple of bs), exactly full, a multiple of bs, one short of a block.
    return [1, 3 * bs + 5, num_blocks * bs, 2 * bs, bs - 1]


def _make_case(ctx_lens, bs, hkv, g, d, dtype, layout, q_dtype=None, seed=0):
    """Random paged cache in vLLM's NHD or HND memory order, viewed as (B, Hkv, bs, 2D)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    R, hq = len(ctx_lens), hkv * g
    n_cache = R * NUM_BLOCKS + 4
    if layout == "nhd":
        kv = torch.randn(n_cache, bs, hkv, 2 * d, generator=gen, device="cuda")
        kv = kv.to(dtype).permute(0, 2, 1, 3)
    else:
        kv = torch.randn(n_cache, hkv, bs, 2 * d, generator=gen, device="cuda").to(dtype)
    perm = torch.randperm(n_cache, generator=gen, device="cuda")[: R * NUM_BLOCKS]
    bt = torch.randint(0, n_cache, (R, NUM_BLOCKS + GARBAGE_COLS), generator=gen,
                       device="cuda", dtype=torch.int32)
    bt[:, :NUM_BLOCKS] = perm.view(R, NUM_BLOCKS).to(torch.int32)
    for r, c in enumerate(ctx_lens):  # valid garbage indices past the valid blocks
        nv = -(-c // bs)
        bt[r, nv:] = torch.randint(0, n_cache, (bt.shape[1] - nv,), generator=gen,
                                   device="cuda", dtype=torch.int32)
    # Query as a strided slice of a fused qkv buffer, like vLLM's.
    qkv = torch.randn(R, (hq + 2 * hkv) * d, generator=gen, device="cuda")
    q = qkv.to(q_dtype or dtype)[:, : hq * d].view(R, hq, d)
    cl = torch.tensor(ctx_lens, dtype=torch.int32, device="cuda")
    return q, kv, bt, cl


def _assert_match(out, ref, tol):
    assert out.shape == ref.shape and out.dtype == torch.float32
    ninf_out = torch.isneginf(out)
    ninf_ref = torch.isneginf(ref)
    assert torch.equal(ninf_out, ninf_ref), "-inf positions differ"
    fin = torch.isfinite(ref)
    assert torch.equal(fin, torch.isfinite(out)), "non-finite entries differ"
    torch.testing.assert_close(out[fin], ref[fin], atol=tol, rtol=tol)


def _tol(*dtypes):
    return 1e-3 if all(dt == torch.float32 for dt in dtypes) else 2e-2


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_matches_torch(impls, block_size, head_size, gqa, dtype, layout):
    triton_fn, torch_fn = impls
    ctx = _ctx_lens(block_size, NUM_BLOCKS)
    q, kv, bt, cl = _make_case(ctx, block_size, 2, gqa, head_size, dtype, layout)
    scale = head_size ** -0.5
    out = triton_fn(q, kv, bt, cl, NUM_BLOCKS, scale)
    ref = torch_fn(q, kv, bt, cl, NUM_BLOCKS, scale)
    _assert_match(out, ref, _tol(dtype))
    # Blocks past each row's context are -inf; the rest are finite.
    nv = (cl + block_size - 1) // block_size
    valid = torch.arange(NUM_BLOCKS, device="cuda")[None, :] < nv[:, None]
    assert torch.equal(torch.isfinite(out), valid[:, None, :].expand_as(out))


@pytest.mark.parametrize("head_size", [80, 96])
def test_non_pow2_head_size(impls, head_size):
    triton_fn, torch_fn = impls
    q, kv, bt, cl = _make_case(_ctx_lens(16, NUM_BLOCKS), 16, 2, 4, head_size,
                               torch.bfloat16, "nhd")
    args = (q, kv, bt, cl, NUM_BLOCKS, head_size ** -0.5)
    _assert_match(triton_fn(*args), torch_fn(*args), 2e-2)


@pytest.mark.parametrize("q_dtype,kv_dtype", [(torch.float32, torch.bfloat16),
                                              (torch.float32, torch.float16),
                                              (torch.bfloat16, torch.float32)])
def test_mixed_dtypes(impls, q_dtype, kv_dtype):
    triton_fn, torch_fn = impls
    q, kv, bt, cl = _make_case(_ctx_lens(16, NUM_BLOCKS), 16, 2, 4, 128, kv_dtype, "hnd",
                               q_dtype=q_dtype)
    args = (q, kv, bt, cl, NUM_BLOCKS, 128 ** -0.5)
    _assert_match(triton_fn(*args), torch_fn(*args), _tol(q_dtype, kv_dtype))


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_invalid_slots_never_used(impls, layout):
    """Tail slots of partial blocks hold NaN and table entries past the valid blocks
    point at an all-NaN block: the kernel must still match the clean reference."""
    triton_fn, torch_fn = impls
    bs, d = 16, 128
    ctx = _ctx_lens(bs, NUM_BLOCKS) + [0]
    q, kv, bt, cl = _make_case(ctx, bs, 2, 4, d, torch.bfloat16, layout)
    ref = torch_fn(q, kv, bt, cl, NUM_BLOCKS, d ** -0.5)

    n_valid = [-(-c // bs) for c in ctx]
    owned = set(torch.cat([bt[r, :nv] for r, nv in enumerate(n_valid)]).tolist())
    nan_block = min(set(range(kv.shape[0])) - owned)  # a cache block no row owns
    poison = kv.clone()
    poison[nan_block] = float("nan")
    bt_p = bt.clone()
    for r, (c, nv) in enumerate(zip(ctx, n_valid)):
        bt_p[r, nv:] = nan_block
        if c % bs:
            poison[bt[r, nv - 1].long(), :, c % bs:, :] = float("nan")
    out = triton_fn(q, poison, bt_p, cl, NUM_BLOCKS, d ** -0.5)
    _assert_match(out, ref, 2e-2)
    assert torch.isneginf(out[-1]).all(), "ctx_len=0 row must be all -inf"


def test_long_context_many_tiles_per_program(impls):
    """32K-token row next to short rows: exercises several tiles per program."""
    triton_fn, torch_fn = impls
    bs, d, hkv, g = 16, 128, 8, 4
    ctx = [32768, 4097, 1]
    nb = 32768 // bs
    gen = torch.Generator(device="cuda").manual_seed(1)
    n_cache = len(ctx) * nb
    kv = torch.randn(n_cache, bs, hkv, 2 * d, generator=gen, device="cuda")
    kv = kv.to(torch.bfloat16).permute(0, 2, 1, 3)
    bt = torch.randperm(n_cache, generator=gen, device="cuda").view(len(ctx), nb)
    bt = bt.to(torch.int32)
    q = torch.randn(len(ctx), hkv * g, d, generator=gen, device="cuda").to(torch.bfloat16)
    cl = torch.tensor(ctx, dtype=torch.int32, device="cuda")
    args = (q, kv, bt, cl, nb, d ** -0.5)
    _assert_match(triton_fn(*args), torch_fn(*args), 2e-2)
