"""GPU test: vLLM's spec-decode kernels that take a step's request or token
count, or inputs sliced at an offset, compile once for every step shape under
the plugin's patch (``compat.patches.STEP_SHAPE_SPECIALISATION``), the input
copy once per block at warm-up (``compat.warm_up_input_copies``), and all
still compute what they did. Without the patch each compiled again for 1, for
a multiple of 16 and any other count, and for unaligned inputs: 1-3 s stalls
inside a server's first runs (2026-11-29 and 30)."""

import types

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="Triton kernels need CUDA"),
]

COUNTS = (1, 2, 16, 48)
K = 4  # draft tokens a request
VOCAB = 128256  # Llama 3's
I32 = dict(dtype=torch.int32, device="cuda")


@pytest.fixture(scope="module")
def utils():
    from vllm.v1.spec_decode import utils

    from vllm_specextend import compat
    from vllm_specextend.compat import patches

    kernels = [getattr(utils, name) for name in patches.STEP_SHAPE_PARAMS]
    if any(k.device_caches for k in kernels):
        pytest.skip("vLLM's kernels ran earlier in this process: run this file alone")
    assert compat.compile_once_per_step_shape() == len(kernels)
    return utils


def _compiles(kernel) -> int:
    (kernel_cache, *_), = kernel.device_caches.values()
    return len(kernel_cache)


@pytest.fixture(scope="module")
def proposer(utils):
    """A proposer's buffers, its spec-decode kernels warmed up before any
    test here launches them, as the plugin does before a server's first
    request: later launches at a step's shapes compile nothing more."""
    from vllm_specextend import compat

    proposer = _proposer()
    # Sampled widths 1..K + 1, the input preparation, the copy's 8 blocks.
    assert compat.warm_up_spec_decode_kernels(proposer) == K + 1 + 1 + 8
    return proposer


def test_warm_up_compiles_what_steps_use(utils, proposer):
    # Widths of 1 (a prompt's step), 2, 3-4 and 5 (K + 1) tokens sampled a
    # row: a block each; the input copy once a block; each later test keeps
    # these counts.
    assert _compiles(utils.eagle_prepare_next_token_padded_kernel) == 4
    assert _compiles(utils.eagle_prepare_inputs_padded_kernel) == 1
    assert _compiles(utils.copy_and_expand_eagle_inputs_kernel) == 8


def test_prepare_inputs_compiles_once_for_every_request_count(utils, proposer):
    kernel = utils.eagle_prepare_inputs_padded_kernel
    for n in COUNTS:
        drafts = torch.full((n,), K, **I32)  # [n]
        drafts[::2] = 0  # every other row drafted nothing (a prompt's end)
        valid = (torch.arange(n, **I32) % (K + 1)) + 1  # [n], 1..K+1
        qsl = torch.zeros(n + 1, **I32)  # [n + 1]
        qsl[1:] = torch.cumsum(drafts + 1, 0)
        index = torch.empty(n, **I32)
        rejected = torch.empty(n, **I32)
        kernel[(n,)](torch.cumsum(drafts, 0, dtype=torch.int32), valid, qsl, index,
                     rejected, n)
        want = torch.where(drafts > 0, drafts + 1 - valid, 0)
        assert torch.equal(rejected, want)
        assert torch.equal(index, qsl[1:] - 1 - want)
    assert _compiles(kernel) == 1


def test_prepare_next_token_compiles_once_for_every_request_count(utils, proposer):
    kernel = utils.eagle_prepare_next_token_padded_kernel
    vocab = VOCAB
    for n in COUNTS:
        sampled = torch.randint(0, vocab, (n, K + 1), **I32)  # [n, K + 1]
        accepted = torch.arange(n, device="cuda") % (K + 2)  # 0..K+1 valid a row
        sampled[torch.arange(K + 1, device="cuda")[None, :] >= accepted[:, None]] = -1
        discard = torch.zeros(n, dtype=torch.bool, device="cuda")
        discard[-1] = n > 1
        backup = torch.full((n,), 7, **I32)
        next_ids = torch.empty(n, **I32)
        count = torch.empty(n, **I32)
        kernel[(n,)](sampled, discard, backup, next_ids, count, vocab, K + 1, n,
                     sampled.stride(0), BLOCK_SIZE_TOKENS=8)
        last = sampled.gather(1, (accepted - 1).clamp(min=0)[:, None].long())[:, 0]
        want_ids = torch.where((accepted > 0) & ~discard, last, backup)
        assert torch.equal(next_ids, want_ids)
        assert torch.equal(count, torch.where(discard, 0, accepted).to(torch.int32))
    assert _compiles(kernel) == 4  # the warm-up's


def _proposer(max_tokens: int = 2 * 8192 + 64):
    """The buffers and constants of vLLM's draft-model proposer that its
    spec-decode kernels read (``LLMBaseProposer.set_inputs_first_pass``,
    ``prepare_next_token_ids_padded``)."""
    return types.SimpleNamespace(
        device=torch.device("cuda"), needs_extra_input_slots=True,
        num_speculative_tokens=K,
        runner=types.SimpleNamespace(
            input_batch=types.SimpleNamespace(vocab_size=VOCAB)),
        backup_next_token_ids=types.SimpleNamespace(gpu=torch.zeros(256, **I32)),
        extra_slots_per_request=1, parallel_drafting_token_id=0,
        pass_hidden_states_to_model=False,
        input_ids=torch.zeros(max_tokens, **I32),
        positions=torch.zeros(max_tokens, dtype=torch.int64, device="cuda"),
        is_rejected_token_mask=torch.zeros(max_tokens, dtype=torch.bool, device="cuda"),
        is_masked_token_mask=torch.zeros(max_tokens, dtype=torch.bool, device="cuda"),
    )


def _copy(kernel, proposer, query_lens: list[int], offset: int):
    """One step's copy as vLLM launches it, its inputs ``offset`` int32s into
    their buffers (as a prompt pass slices them); returns the draft's ids."""
    from triton import next_power_of_2

    n, total = len(query_lens), sum(query_lens)
    gen = torch.Generator(device="cuda").manual_seed(total)

    def at_offset(values: torch.Tensor) -> torch.Tensor:
        buffer = values.new_zeros(offset + len(values))
        buffer[offset:] = values
        return buffer[offset:]

    ids = at_offset(torch.randint(0, 1000, (total,), generator=gen, **I32))
    pos = at_offset(torch.arange(total, device="cuda") + 100)  # int64
    bonus = at_offset(torch.randint(1000, 2000, (n,), generator=gen, **I32))
    qsl = at_offset(torch.zeros(n + 1, **I32))
    qsl[1:] = torch.cumsum(torch.tensor(query_lens, **I32), 0)
    block = min(256, next_power_of_2(max(query_lens) + 1))
    kernel[(n, -(-(max(query_lens) + 1) // block))](
        target_token_ids_ptr=ids, target_positions_ptr=pos, next_token_ids_ptr=bonus,
        out_input_ids_ptr=proposer.input_ids, out_positions_ptr=proposer.positions,
        out_is_rejected_token_mask_ptr=proposer.is_rejected_token_mask,
        out_is_masked_token_mask_ptr=proposer.is_masked_token_mask,
        out_new_token_indices_ptr=torch.empty(n, **I32),
        out_hidden_state_mapping_ptr=torch.empty(total, **I32),
        query_start_loc_ptr=qsl, query_end_loc_ptr=qsl[1:] - 1, padding_token_id=0,
        parallel_drafting_token_id=0, total_input_tokens=total,
        num_padding_slots_per_request=1, shift_input_ids=False,
        BLOCK_SIZE_TOKENS=block)
    # Each request's tokens, then its bonus token (no rejected slots here).
    want = torch.cat([torch.cat([part, bonus[i:i + 1]]) for i, part in
                      enumerate(ids.split(query_lens))])
    got = proposer.input_ids[:total + n].clone()
    assert torch.equal(got, want)
    return got


def test_input_copy_compiles_once_a_block_at_warm_up(utils, proposer):
    from vllm.v1.spec_decode import llm_base_proposer

    kernel = llm_base_proposer.copy_and_expand_eagle_inputs_kernel
    assert kernel is utils.copy_and_expand_eagle_inputs_kernel
    # Decode steps (K + 1 tokens a request), prompt chunks and a prompt's
    # short tail, at every request count and with inputs aligned or not.
    steps = [[K + 1] * n for n in COUNTS] + [[8192], [K + 1, 8192], [37], [1, 3], [1]]
    for lens in steps:
        aligned = _copy(kernel, proposer, lens, offset=0)
        assert torch.equal(_copy(kernel, proposer, lens, offset=3), aligned)
    assert _compiles(kernel) == 8  # the warm-up's


def test_batch_change_correction_compiles_at_warm_up(utils):
    # vLLM's async correction of computed-token counts (torch.compile,
    # dynamic, inductor): its four graphs compiled at warm-up are all that
    # steps of 1 to 48 requests after 1 to 48 ask for.
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from vllm_specextend import compat

    correction = utils.update_num_computed_tokens_for_batch_change
    code = correction._torchdynamo_orig_callable.__code__
    if _debug_get_cache_entry_list(code):
        pytest.skip("the correction ran earlier in this process: run this file alone")
    max_reqs = 256

    def buffer(dtype):
        return types.SimpleNamespace(
            gpu=torch.zeros(max_reqs, dtype=dtype, device="cuda"))

    runner = types.SimpleNamespace(
        use_async_spec_decode=True,
        num_computed_tokens=torch.zeros(max_reqs, **I32),
        prev_positions=buffer(torch.int64), num_accepted_tokens=buffer(torch.int32),
        prev_num_draft_tokens=buffer(torch.int32),
        input_batch=types.SimpleNamespace(
            num_computed_tokens_cpu_tensor=torch.arange(max_reqs, dtype=torch.int32)))
    assert compat.warm_up_batch_change(runner) == 4
    assert len(_debug_get_cache_entry_list(code)) == 4
    for num_reqs, prev_reqs in [(1, 1), (2, 1), (3, 2), (16, 1), (1, 16), (48, 47)]:
        prev = torch.full((prev_reqs,), K + 1, **I32)  # valid tokens a row before
        runner.prev_positions.gpu[:num_reqs] = torch.arange(num_reqs) % prev_reqs
        runner.prev_num_draft_tokens.gpu.fill_(K)
        counts = runner.num_computed_tokens.clone()
        with torch.inference_mode():  # as GPUModelRunner.execute_model runs it
            correction(runner.num_computed_tokens,
                       runner.num_accepted_tokens.gpu[:num_reqs],
                       runner.prev_positions.gpu[:num_reqs], prev.clone(),
                       runner.prev_num_draft_tokens.gpu,
                       runner.input_batch.num_computed_tokens_cpu_tensor[
                           :num_reqs].to(device="cuda", non_blocking=True))
        gather = runner.prev_positions.gpu[:num_reqs]
        want = counts[gather] + K + 1
        assert torch.equal(runner.num_computed_tokens[:num_reqs], want)
    assert len(_debug_get_cache_entry_list(code)) == 4
