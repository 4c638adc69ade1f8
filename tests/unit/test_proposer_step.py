"""The plugin's own work on a step (plan, retrieve, view), outside vLLM's loop.

A proposer is assembled around a stand-in runner and attention layer, and its
step (``_plan_view``, then ``_gather_view``) runs over a changing batch. On CPU this checks the
wiring; on a GPU (``-m gpu``) it also proves the step makes no host-device
sync: it runs under ``torch.cuda.set_sync_debug_mode("error")``, which raises
on any synchronizing call (a ``.item()``, a blocking copy, a ``nonzero``).
vLLM's own drafting loop is not part of this: in sync scheduling the runner
copies sampled tokens to the host every step (``_bookkeeping_sync``), which
the plugin does not control.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from vllm_specextend.config import SpecExtendConfig

BS, HKV, GROUP, D = 16, 2, 2, 32
NUM_BLOCKS = 1200
CFG = SpecExtendConfig(top_k=4, recent_tokens=64, min_context=256, retrieve_every=2,
                       draft_prompt_pool=None, lookup_tokens=0,
                       draft_prefill_window=None, draft_pool_fill=None)
POOLED = SpecExtendConfig(top_k=4, recent_tokens=64, min_context=256, retrieve_every=2,
                          draft_prompt_pool=8, lookup_tokens=0,
                          draft_prefill_window=None, draft_pool_fill=None)
"""The same with prompts of 416 tokens on pooled (``prompt_pool.py``): each
request's first step ends its prompt, so the pools are chosen there too."""


def _layer(device):
    kv = torch.randn(NUM_BLOCKS, HKV, BS, 2 * D, device=device, dtype=torch.float16
                     if device.type == "cuda" else torch.float32)
    impl = types.SimpleNamespace(scale=D ** -0.5, forward=lambda *a, **k: None)
    return types.SimpleNamespace(kv_cache=kv, impl=impl, num_heads=HKV * GROUP,
                                 head_size=D)


def _proposer(device, layer, runner, cfg=CFG):
    from vllm_specextend.proposer import SpecExtendProposer
    from vllm_specextend.retrieval.retriever import Retriever
    from vllm_specextend.retrieval.staging import HostStaging
    from vllm_specextend.serving.stats import SpecExtendStats

    proposer = object.__new__(SpecExtendProposer)  # no engine: the plugin's step
    proposer.vllm_config = types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_seqs=16)
    )
    proposer.speculative_config = types.SimpleNamespace(num_speculative_tokens=3)
    proposer.device = device
    proposer.runner = runner
    proposer.stats = SpecExtendStats()
    proposer.staging = HostStaging(device)
    proposer.compactor = None
    proposer.block_size = BS
    proposer._min_context = cfg.min_context
    proposer.max_model_len = 4096
    proposer.retriever = Retriever(cfg, None, proposer.staging, device)
    proposer._use_config(cfg)
    proposer.retriever.attach(layer, 256, layer.kv_cache.dtype, tp_size=1)
    if device.type == "cpu":  # the stand-in layer stores keys in plain order
        proposer.retriever._key_order = torch.arange(BS * D)
    return proposer


def _step(runner, device, live, rng, table):
    """One decode step of the live requests: (cad, token indices, rejected)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    ids = list(live)
    seq = np.array([live[r][1] for r in ids])
    prompt = np.array([live[r][0] for r in ids])
    query = np.where(seq - 4 < prompt, np.minimum(seq, 4), 4)
    qsl = np.concatenate([[0], np.cumsum(query)]).astype(np.int32)
    runner.input_batch.req_ids = ids
    runner.input_batch.num_prompt_tokens = prompt.astype(np.int32)
    runner.optimistic_seq_lens_cpu = torch.from_numpy(seq.astype(np.int32))
    runner.requests = dict.fromkeys(ids)
    rows = torch.tensor([table[r] for r in ids], dtype=torch.int32)
    cad = CommonAttentionMetadata(
        query_start_loc=torch.from_numpy(qsl).to(device),
        query_start_loc_cpu=torch.from_numpy(qsl),
        seq_lens=torch.from_numpy(seq.astype(np.int32)).to(device),
        num_reqs=len(ids),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=4,
        max_seq_len=int(seq.max()),
        block_table_tensor=rows.to(device),
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64, device=device),
    )
    token_indices = torch.from_numpy(qsl[1:] - 1).to(device)
    rejected = torch.from_numpy(rng.integers(0, 3, len(ids)).astype(np.int32)).to(device)
    return cad, token_indices, rejected


def _prepare_view(proposer, cad, token_indices, rejected):
    step = proposer._plan_view(cad, token_indices, rejected)
    return proposer._gather_view(step, cad)


def _run(device, steps=24, cfg=CFG):
    rng = np.random.default_rng(0)
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace())
    layer = _layer(device)
    proposer = _proposer(device, layer, runner, cfg)
    live = {f"r{i}": [int(n), int(n)] for i, n in enumerate([1800, 300, 900, 60])}
    tables = {r: rng.permutation(NUM_BLOCKS)[:160].tolist() for r in live}
    views = 0
    for step in range(steps):
        cad, token_indices, rejected = _step(runner, device, live, rng, tables)
        if step == 0 or device.type != "cuda":
            view = _prepare_view(proposer, cad, token_indices, rejected)
        else:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                view = _prepare_view(proposer, cad, token_indices, rejected)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        views += view is not None
        if view is not None:
            assert view.block_table.shape == cad.block_table_tensor.shape
        for r in live:
            live[r][1] += 2
        if step == 10:  # a request leaves, another arrives: the mapping changes
            gone = "r1"
            del live[gone]
            proposer.state.release({gone})
            live["r4"] = [1300, 1300]
            tables["r4"] = rng.permutation(NUM_BLOCKS)[:160].tolist()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return proposer, views


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> torch.device:
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return torch.device(request.param)


@pytest.mark.parametrize("cfg", [CFG, POOLED], ids=["full-pass", "pooled"])
def test_step_runs_and_retrieves(device, cfg):
    proposer, views = _run(device, cfg=cfg)
    stats = proposer.stats.snapshot()
    # Pooled: the long prompts at the first step, and the one that arrives at
    # step 11, under the sync check on a GPU (its pool chosen without a sync).
    if cfg is POOLED:
        assert stats["pooled_prompt_passes"] > 0
        assert proposer.pools.pooled[proposer.state.slot_of("r4")]
    else:
        assert stats["pooled_prompt_passes"] == 0 and proposer.pools is None
    assert views > 0 and stats["retrievals"] > 0
    assert stats["view_rows"] > 0
    # Long requests hold selections, the 60-token one never does.
    assert proposer.state.selection("r0") is not None
    assert proposer.state.selection("r3") is None
    assert proposer.state.slot_of("r1") is None


@pytest.mark.parametrize("first", [0, 1], ids=["whole-step", "cut-step"])
def test_a_pooled_rows_ids_never_read_draft_placeholders(first):
    # The CPU soak's engine death (CI runs 62, 63): batch row 2 ends a
    # 545-token prompt with its last token and 3 draft tokens past its end
    # (positions 544..547). The runner's host copy holds -1 there; the step's
    # tokens hold the real ids. ``first``: the drafting part of a cut step
    # starts at that batch row, so ``cad``'s rows count from it.
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from vllm_specextend.drafting.prompt_pool import PoolRows
    from vllm_specextend.proposer import SpecExtendProposer

    rng = np.random.default_rng(1)
    host = rng.integers(0, 1000, (3, 600)).astype(np.int32)
    host[2, 545:] = -1  # draft-token placeholders past the prompt's end
    runner = types.SimpleNamespace(
        input_batch=types.SimpleNamespace(token_ids_cpu=host))
    proposer = object.__new__(SpecExtendProposer)
    proposer.runner, proposer.device = runner, torch.device("cpu")
    query = np.array([4, 4, 4])[first:]  # [num_reqs] of cad
    qsl = np.concatenate([[0], np.cumsum(query)]).astype(np.int32)
    step_ids = torch.from_numpy(rng.integers(1000, 2000, int(qsl[-1]))
                                .astype(np.int32))  # [num_tokens]
    cad = CommonAttentionMetadata(
        query_start_loc=torch.from_numpy(qsl),
        query_start_loc_cpu=torch.from_numpy(qsl),
        seq_lens=torch.zeros(len(query), dtype=torch.int32), num_reqs=len(query),
        num_actual_tokens=int(qsl[-1]), max_query_len=4, max_seq_len=548,
        block_table_tensor=torch.zeros(len(query), 1, dtype=torch.int32),
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64))
    pool = PoolRows(rows=np.array([2]), seq=np.array([548]),
                    window_start=np.array([480]),
                    chunks=torch.zeros(1, 4, dtype=torch.int32), sink_tokens=32,
                    chunk_size=32, q_start=np.array([544]))
    (ids,) = proposer._pool_prompt_ids(pool, step_ids, cad, first)
    assert ids.shape == (548,) and ids.dtype == torch.int64
    assert (ids >= 0).all(), "a placeholder reached the draft's embedding"
    assert ids[:544].tolist() == host[2, :544].tolist()
    r = 2 - first
    assert ids[544:].tolist() == step_ids[int(qsl[r]):int(qsl[r + 1])].tolist()


def _triton_key(*args):
    """What Triton specialises a call on, for the tensor arguments: dtype,
    rank, and per stride whether it is 1 or a multiple of 16 (and the data
    pointer's 16-byte alignment)."""
    return tuple(
        (a.dtype, a.dim(), a.data_ptr() % 16 == 0,
         tuple((s == 1, s % 16 == 0) for s in a.stride()))
        for a in args if isinstance(a, torch.Tensor))


@pytest.mark.parametrize("cfg", [CFG, POOLED], ids=["full", "pooled"])
def test_the_kernels_warm_up_without_a_trace(device, monkeypatch, cfg):
    # Before vLLM's warm-up the plugin scores a one-token context and drafts
    # one greedy token (on a GPU: its Triton kernels compile then, not in a
    # server's first request), with the argument kinds steps use, and
    # nothing of it may stay: no counts, no state, the queries as they were.
    # The selection too (its torch kernels load on first launch), at the
    # config's k: the top-k chunks and, pooled, the pool's.
    from vllm_specextend.drafting.tuning import DraftTuning
    from vllm_specextend.retrieval import retriever

    calls, picks = [], []

    def recorded(*args, **kwargs):
        calls.append(_triton_key(*args))
        return block_lse(*args, **kwargs)

    def picked(mass, lo, hi, k, allowed=None):
        picks.append((mass.shape[1], k, allowed is not None))
        return select_chunks(mass, lo, hi, k, allowed)

    block_lse, select_chunks = retriever.block_lse, retriever.select_chunks
    monkeypatch.setattr(retriever, "block_lse", recorded)
    monkeypatch.setattr(retriever, "select_chunks", picked)
    _run(device, steps=6, cfg=cfg)
    steps = set(calls)
    assert steps, "the steps scored nothing"
    step_picks = {(k, masked) for _, k, masked in picks}
    calls.clear()
    picks.clear()
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace())
    proposer = _proposer(device, _layer(device), runner, cfg)
    logits = []  # the draft's greedy sample, as a step's: [1, vocab] logits

    def compute_logits(hidden):
        logits.append(torch.zeros(hidden.shape[0], 100, device=hidden.device))
        return logits[-1]

    proposer.model = types.SimpleNamespace(compute_logits=compute_logits)
    proposer.draft_model_config = types.SimpleNamespace(get_hidden_size=lambda: 64)
    proposer.dtype = torch.float32
    proposer._vocab_rows = None
    proposer._tuning = DraftTuning.from_env(device)  # a GPU's: the Triton argmax
    proposer.use_local_argmax_reduction = proposer.use_heterogeneous_vocab = False
    # vLLM's spec-decode kernels, as a step launches them: the next-token
    # preparation for 1 to K + 1 tokens sampled a row, the input
    # preparation, the copy of a step's inputs (the draft-model pathway's)
    # for every block of tokens.
    from vllm.v1.spec_decode import llm_base_proposer

    from vllm_specextend.compat.warmup import INPUT_COPY_BLOCKS

    launches = []

    class Launches:
        def __init__(self, name):
            self.name, self.kernel = name, getattr(llm_base_proposer, name)

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((self.name, grid, kwargs.get("BLOCK_SIZE_TOKENS")))
                if device.type == "cuda":
                    self.kernel[grid](*args, **kwargs)
            return launch

    names = ("eagle_prepare_next_token_padded_kernel",
             "eagle_prepare_inputs_padded_kernel",
             "copy_and_expand_eagle_inputs_kernel")
    for name in names:
        monkeypatch.setattr(llm_base_proposer, name, Launches(name))
    tokens = 64
    runner.input_batch.vocab_size = 100
    proposer.num_speculative_tokens = 3
    proposer.backup_next_token_ids = types.SimpleNamespace(
        gpu=torch.zeros(16, dtype=torch.int32, device=device))
    proposer.needs_extra_input_slots, proposer.extra_slots_per_request = True, 1
    proposer.parallel_drafting_token_id = 0
    proposer.pass_hidden_states_to_model = False
    proposer.input_ids = torch.zeros(tokens, dtype=torch.int32, device=device)
    proposer.positions = torch.zeros(tokens, dtype=torch.int64, device=device)
    proposer.is_rejected_token_mask = torch.zeros(tokens, dtype=torch.bool,
                                                  device=device)
    proposer.is_masked_token_mask = torch.zeros_like(proposer.is_rejected_token_mask)
    before = proposer.retriever.query_buf.clone()
    proposer.warm_up_kernels()
    assert launches == [(names[0], (1,), b) for b in (1, 2, 4, 4)] + [
        (names[1], (1,), None)] + [
        (names[2], (1, 1), b) for b in INPUT_COPY_BLOCKS]
    assert len(calls) == 1 and calls[0] in steps, (calls, steps)
    chunks = proposer.max_model_len // cfg.chunk_size + 1
    pooled = cfg.draft_prompt_pool is not None
    # As the steps select: the pool over every chunk, then the top-k in it.
    assert picks == [(chunks, cfg.draft_prompt_pool, False)] * pooled + [
        (chunks, cfg.top_k, pooled)]
    assert {(k, masked) for _, k, masked in picks} == step_picks
    if pooled:
        assert proposer.pools.allowed.all() and not proposer.pools.pooled.any()
    assert [t.shape for t in logits] == [torch.Size([1, 100])]
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(proposer.retriever.query_buf, before)
    assert proposer.stats.snapshot() == type(proposer.stats)().snapshot()
    assert len(proposer.state) == 0
