"""GPU test: vLLM's spec-decode kernels that take a step's request count
compile once for 1, 2, 16 and 48 requests under the plugin's patch
(``compat.patches.BATCH_COUNT_SPECIALISATION``), and still compute what they
did. Without it each compiles three times: for 1, for a multiple of 16 and for
any other count (a 1-3 s stall when a server's batch first reaches each,
2026-11-29)."""

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels need CUDA"),
]

COUNTS = (1, 2, 16, 48)
K = 4  # draft tokens a request


@pytest.fixture(scope="module")
def utils():
    from vllm.v1.spec_decode import utils

    from vllm_specextend import compat

    kernels = [getattr(utils, name) for name in compat.BATCH_COUNT_KERNELS]
    if any(k.device_caches for k in kernels):
        pytest.skip("vLLM's kernels ran earlier in this process: run this file alone")
    assert compat.compile_once_per_batch_count() == len(kernels)
    return utils


def _compiles(kernel) -> int:
    (kernel_cache, *_), = kernel.device_caches.values()
    return len(kernel_cache)


def test_prepare_inputs_compiles_once_for_every_request_count(utils):
    kernel = utils.eagle_prepare_inputs_padded_kernel
    for n in COUNTS:
        i32 = dict(dtype=torch.int32, device="cuda")
        drafts = torch.full((n,), K, **i32)  # [n]
        drafts[::2] = 0  # every other row drafted nothing (a prompt's end)
        valid = (torch.arange(n, **i32) % (K + 1)) + 1  # [n], 1..K+1
        qsl = torch.zeros(n + 1, **i32)  # [n + 1]
        qsl[1:] = torch.cumsum(drafts + 1, 0)
        index = torch.empty(n, **i32)
        rejected = torch.empty(n, **i32)
        kernel[(n,)](torch.cumsum(drafts, 0, dtype=torch.int32), valid, qsl, index,
                     rejected, n)
        want = torch.where(drafts > 0, drafts + 1 - valid, 0)
        assert torch.equal(rejected, want)
        assert torch.equal(index, qsl[1:] - 1 - want)
    assert _compiles(kernel) == 1


def test_prepare_next_token_compiles_once_for_every_request_count(utils):
    kernel = utils.eagle_prepare_next_token_padded_kernel
    vocab = 128256
    for n in COUNTS:
        i32 = dict(dtype=torch.int32, device="cuda")
        sampled = torch.randint(0, vocab, (n, K + 1), **i32)  # [n, K + 1]
        accepted = torch.arange(n, device="cuda") % (K + 2)  # 0..K+1 valid a row
        sampled[torch.arange(K + 1, device="cuda")[None, :] >= accepted[:, None]] = -1
        discard = torch.zeros(n, dtype=torch.bool, device="cuda")
        discard[-1] = n > 1
        backup = torch.full((n,), 7, **i32)
        next_ids = torch.empty(n, **i32)
        count = torch.empty(n, **i32)
        kernel[(n,)](sampled, discard, backup, next_ids, count, vocab, K + 1, n,
                     sampled.stride(0), BLOCK_SIZE_TOKENS=8)
        last = sampled.gather(1, (accepted - 1).clamp(min=0)[:, None].long())[:, 0]
        want_ids = torch.where((accepted > 0) & ~discard, last, backup)
        assert torch.equal(next_ids, want_ids)
        assert torch.equal(count, torch.where(discard, 0, accepted).to(torch.int32))
    assert _compiles(kernel) == 1
