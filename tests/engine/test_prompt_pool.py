"""``draft_prompt_pool``: the draft's KV of a long prompt only for its sinks,
its pool of top-ranked chunks and its window (CPU, fp32, in-process engines).

Prompts are computed in chunks of 128 tokens per request and step, so every
prompt's earlier chunks come in steps of their own or beside other rows (the
steps ``kept_passes.py`` keeps or cuts): in pool mode those passes are
dropped and the step that ends each prompt runs its pooled pass. Greedy
output must stay plain decoding's, also for a prompt served again from the
prefix cache and where pooled passes must run alone; the draft must propose
otherwise than with its full pass (its KV of the prompt is computed from
less), and its first layer's KV must be the full pass's wherever its views
read. One engine per mode serves the first three tests.
"""

from __future__ import annotations

import pytest
import torch
from cpu_engine import counter, generate, make_llm, plain_reference, shutdown
from test_lossless import CMR

from benchmarks.harness.drafter import DraftRecorder, drafter, stats

pytestmark = pytest.mark.engine

LENGTHS = [1500, 1000, 700, 300]  # the last one too short to pool
MAX_TOKENS = 32
CHUNKED = dict(max_num_batched_tokens=1024, long_prefill_token_threshold=128)
POOL = 8
SHARER = 400
"""The start of prompt 0 as a prompt of its own: too short to pool (from 416
tokens at POOL 8) but drafting through a view (from 256), its blocks cached
from prompt 0, whose pooled pass wrote their draft KV only where prompt 0's
views read (docs/design.md, the pool's known limits: drafts, never output)."""


@pytest.fixture(scope="module")
def prompts(long_prompts):
    return long_prompts(LENGTHS)


_RUNS: dict[tuple, dict] = {}


def _run(target, draft, prompts, pool=None, draft_graph=None, fill=None,
         env: tuple[tuple[str, str], ...] = ()):
    """One engine's run over ``prompts``, read from the first ask: greedy
    outputs, proposals and counters; the draft's first-layer KV of prompt 0
    right after the step that ends it (``_record_kv_at_prompt_end``) and, with
    a fill, at its last step (``_record_kv_while_live``); pooled, prompt 0 once
    more, from the prefix cache. ``env``: (name, value) pairs of experiment
    switches set while the engine starts."""
    key = (target, draft, tuple(map(tuple, prompts)), pool, draft_graph, fill, env)
    if key in _RUNS:
        return _RUNS[key]
    spec_extend = {**CMR, "draft_prompt_pool": pool}  # None: the full pass
    if draft_graph is not None:
        spec_extend["draft_graph"] = draft_graph
    if fill is not None:
        spec_extend["draft_pool_fill"] = fill
    budget = dict(max_num_batched_tokens=FILL_BUDGET) if fill else {}
    with pytest.MonkeyPatch.context() as switches:  # read as the engine starts
        for name, value in env:
            switches.setenv(name, value)
        llm = make_llm(target, draft, spec_extend, **{**CHUNKED, **budget})
    proposer = drafter(llm)
    replays = _record_pooled_replays(proposer)
    seen = _record_kv_at_prompt_end(proposer, len(prompts[0]))
    last = _record_kv_while_live(proposer, [len(p) for p in prompts[:2]]) \
        if fill or pool is None else {}
    fill_chunks = []
    fills = _record_fill_forwards(proposer, fill_chunks) if fill else []
    recorder = DraftRecorder(llm)
    recorder.enabled = True
    run = dict(outputs=generate(llm, prompts, max_tokens=MAX_TOKENS), seen=seen,
               last=last, fills=fills, fill_chunks=fill_chunks,
               max_num_tokens=proposer.max_num_tokens)
    run.update(proposals=list(recorder.proposals.values()), stats=stats(proposer),
               replays=replays)
    if pool is not None and fill is None:
        recorder.enabled = False
        run["again"] = generate(llm, prompts[:1], max_tokens=MAX_TOKENS)
        run["hits"] = counter(llm, "vllm:prefix_cache_hits")
        run["stats_again"] = stats(proposer)
        run["sharer"] = generate(llm, [prompts[0][:SHARER]], max_tokens=MAX_TOKENS)
        run["sharer_hits"] = counter(llm, "vllm:prefix_cache_hits") - run["hits"]
    shutdown(llm)
    _RUNS[key] = run
    return run


def _record_pooled_replays(proposer) -> list[bool]:
    """Fills the list it returns: for each step that ends a pooled prompt
    and reaches the captured routine, whether the routine drafted it."""
    replay, seen = proposer.capture.replay, []

    def recording(step, *args, **kwargs):
        drafts = replay(step, *args, **kwargs)
        if step.pool is not None:
            seen.append(drafts is not None)
        return drafts

    proposer.capture.replay = recording
    return seen


def _after_each_propose(proposer, record) -> None:
    """``record(cad)`` after each of ``proposer``'s proposes, ``cad`` its step's
    attention metadata."""
    propose = proposer.propose

    def recording(*args, **kwargs):
        drafts = propose(*args, **kwargs)
        record(args[6] if len(args) > 6 else kwargs["common_attn_metadata"])
        return drafts

    proposer.propose = recording


def _first_layer_kv(proposer, row: int, tokens: int, cad, which: int = 0
                    ) -> torch.Tensor:
    """The draft's first-layer (``which``: another's) KV blocks of batch row
    ``row``'s first ``tokens`` tokens, as they stand now."""
    from vllm_specextend import compat

    names = sorted(proposer._draft_attn_layer_names, key=_layer_number)
    layer = compat.attention_layer(proposer.vllm_config, names[which])
    blocks = cad.block_table_tensor[row, : tokens // proposer.block_size]
    return compat.layer_kv_cache(layer)[blocks.long()].clone()


def _layer_number(name: str) -> int:
    """A layer's index in its model from its name (``model.layers.N.attn``)."""
    return int(next(part for part in name.split(".") if part.isdigit()))


def _record_kv_at_prompt_end(proposer, prompt_len: int) -> dict:
    """Fills the dict it returns, at the step that ends batch row 0's prompt
    (the first request's): the draft's first layer's KV blocks of that
    prompt and, pooled, its pool's chunks and its window's start."""
    from vllm_specextend import compat

    seen = {}

    def record(cad):
        if not seen and compat.batch_seq_lens_cpu(proposer.runner, 1)[0] >= prompt_len:
            seen["kv"] = _first_layer_kv(proposer, 0, prompt_len, cad)
            slot = proposer.state.slot_of(compat.batch_req_ids(proposer.runner, 1)[0])
            if proposer.pools is not None:
                seen["pool"] = proposer.pools.chunks[slot].tolist()
                seen["window_start"] = int(proposer.state.window_start[slot])

    _after_each_propose(proposer, record)
    return seen


def _record_kv_while_live(proposer, prompt_lens: list[int]) -> dict:
    """Fills the dict it returns at every step holding the first step's
    rows 0, 1, ... (one per length in ``prompt_lens``): for each, the
    draft's first- and last-layer KV blocks of its prompt and, pooled, which
    chunks its selections may read (``PromptPools.allowed``) and its pool, as they stand
    after the step; the last such step's remain."""
    from vllm_specextend import compat

    seen = {}

    def record(cad):
        ids = list(compat.batch_req_ids(proposer.runner, cad.num_reqs))
        if not seen and len(ids) >= len(prompt_lens):
            seen.update({req: {} for req in ids[: len(prompt_lens)]})
        for (req, last), length in zip(seen.items(), prompt_lens):
            if req not in ids:
                continue
            last["kv"] = _first_layer_kv(proposer, ids.index(req), length, cad)
            last["kv_last"] = _first_layer_kv(proposer, ids.index(req), length, cad,
                                              -1)
            if proposer.pools is not None:
                slot = proposer.state.slot_of(req)
                last["allowed"] = proposer.pools.allowed[slot].tolist()
                last["pool"] = proposer.pools.chunks[slot].tolist()

    _after_each_propose(proposer, record)
    return seen


def _record_fill_forwards(proposer, chunks: list) -> list[list[int]]:
    """Fills the list it returns: for each step whose pools grow, the token
    count of each of its fill forwards; and ``chunks``: each such step's
    chunk ids, a list a row."""
    fill_pools, first_pass_only, steps = proposer._fill_pools, proposer._first_pass_only, []
    inside = []

    def filling(step, cad):
        if step is None or step.fill is None:
            return fill_pools(step, cad)
        chunks.append(step.fill.chunks.tolist())
        steps.append([])
        inside.append(True)
        try:
            return fill_pools(step, cad)
        finally:
            inside.clear()

    def counting(token_ids, positions, next_token_ids, cad):
        if inside:
            steps[-1].append(int(token_ids.shape[0] + next_token_ids.shape[0]))
        return first_pass_only(token_ids, positions, next_token_ids, cad)

    proposer._fill_pools, proposer._first_pass_only = filling, counting
    return steps


@pytest.fixture(scope="module")
def full(tiny_target, tiny_draft, prompts):
    return _run(tiny_target, tiny_draft, prompts)


@pytest.fixture(scope="module")
def pooled(tiny_target, tiny_draft, prompts):
    return _run(tiny_target, tiny_draft, prompts, POOL)


def test_pooled_prompts_stay_lossless_and_change_the_drafts(plain_outputs, full,
                                                            pooled):
    assert full["stats"]["pooled_prompt_passes"] == 0
    assert full["stats"]["dropped_prefill_passes"] == 0
    assert pooled["stats"]["pooled_prompt_passes"] == 3, "the three long prompts"
    assert pooled["stats"]["dropped_prefill_passes"] > 0
    # The 1,500-token prompt ends beside decoding rows only: its pooled pass
    # runs first, then the step drafts as a decode step.
    assert pooled["stats"]["pooled_decode_steps"] >= 1
    assert pooled["outputs"] == full["outputs"] == plain_outputs
    assert pooled["proposals"] != full["proposals"]


def test_a_pooled_prompt_served_from_the_prefix_cache_stays_lossless(
        plain_outputs, pooled):
    """The first prompt again after the batch: it finds its blocks cached
    (their draft KV pooled the first time) and pools again over them."""
    assert pooled["hits"] > 0
    assert pooled["stats_again"]["pooled_prompt_passes"] == 4
    assert pooled["again"] == plain_outputs[:1]


def test_a_shorter_prompt_on_a_pooled_prompts_blocks_stays_lossless(tiny_target,
                                                                   prompts, pooled):
    assert pooled["sharer_hits"] > 0, "served from prompt 0's cached blocks"
    assert pooled["sharer"] == plain_reference(tiny_target, [prompts[0][:SHARER]],
                                               MAX_TOKENS)


def test_the_pooled_pass_writes_the_draft_kv_where_its_views_read(prompts, full,
                                                                  pooled):
    """A first layer's keys and values depend on a token and its position
    only: after the pooled pass the draft's first-layer KV of the sinks, the
    pool's chunks and the window's whole blocks is the full pass's, and
    blocks of other chunks were never written (32-token chunks of 32-token
    blocks, the CPU engines' block size). Some of those may hold the full
    pass's KV all the same: the batch's prompts share their text's start,
    so another prompt's pooled pass may have written a shared block."""
    seen, reference = pooled["seen"], full["seen"]["kv"]
    window = range(seen["window_start"] // 32, len(prompts[0]) // 32)
    read = set(range(CMR.get("sink_tokens", 32) // 32)) | set(seen["pool"]) | set(window)
    assert len(seen["pool"]) == POOL and len(window) > 0
    same = [torch.allclose(seen["kv"][chunk], reference[chunk], rtol=1e-4, atol=1e-5)
            for chunk in range(len(prompts[0]) // 32)]
    assert all(same[chunk] for chunk in read), "where the views read"
    assert sum(not same[chunk] for chunk in range(len(same)) if chunk not in read) > 10


def test_a_pooled_step_beside_decode_rows_replays_the_draft_routine(
        tiny_target, tiny_draft, prompts, plain_outputs, pooled):
    """``draft_graph: static`` runs the captured routine's code on CPU: the
    step that ends the 1,500-token prompt (the others decode) replays it
    after the pooled pass, and drafts what the eager path drafts."""
    static = _run(tiny_target, tiny_draft, prompts, POOL, draft_graph="static")
    assert static["stats"]["pooled_decode_steps"] >= 1
    assert static["replays"] and all(static["replays"]), "every such step replayed"
    assert not any(pooled["replays"]), "eager: no routine"
    assert static["proposals"] == pooled["proposals"], "the same drafts, step by step"
    assert static["outputs"] == plain_outputs


def test_a_prompt_alone_pools_then_drafts_as_a_decode_step(tiny_target, tiny_draft,
                                                          prompts):
    """Batch 1: the step that ends the 1,500-token prompt holds its row alone;
    its pooled pass runs first, then the step drafts as a decode step, the
    routine's code (static) as the eager path."""
    one = [prompts[0]]
    eager = _run(tiny_target, tiny_draft, one, POOL)
    static = _run(tiny_target, tiny_draft, one, POOL, draft_graph="static")
    assert eager["stats"]["pooled_decode_steps"] == 1
    assert static["stats"]["pooled_decode_steps"] == 1
    assert static["replays"] and all(static["replays"])  # again from the cache, too
    assert static["proposals"] == eager["proposals"]
    assert static["outputs"] == eager["outputs"] == plain_reference(tiny_target, one,
                                                                    MAX_TOKENS)


def test_pooled_passes_too_many_for_one_forward_pass_alone(
        tiny_target, tiny_draft, long_prompts):
    """Three prompts of one length, 128 tokens a step each: they end together,
    and the step's first forward (512 tokens) cannot hold every pooled pass
    (~360 tokens each)."""
    same = long_prompts([1000, 1000, 1000])
    plain = plain_reference(tiny_target, same, MAX_TOKENS)
    llm = make_llm(tiny_target, tiny_draft, {**CMR, "draft_prompt_pool": POOL},
                   max_num_batched_tokens=512, long_prefill_token_threshold=128)
    outputs = generate(llm, same, max_tokens=MAX_TOKENS)
    counts = stats(drafter(llm))
    shutdown(llm)

    assert counts["pooled_prompt_passes"] == 3
    assert counts["pooled_passes_alone"] >= 1
    assert outputs == plain


FILL = 8
FILL_BUDGET = 512
"""256 tokens a growing row (FILL chunks of 32): under this step budget the
drafter's buffers hold two such rows, so three rows growing in one step fill
in two forwards."""


@pytest.fixture(scope="module")
def filled(tiny_target, tiny_draft, prompts):
    return _run(tiny_target, tiny_draft, prompts, POOL, fill=FILL)


def test_a_growing_pool_stays_lossless_and_changes_the_drafts(plain_outputs, pooled,
                                                              filled):
    """``draft_pool_fill``: each refresh of a pooled request adds its FILL
    top-ranked chunks without draft KV to its pool and writes their KV, in
    forwards that fit the drafter's buffers."""
    assert filled["stats"]["pooled_prompt_passes"] == 3
    assert filled["stats"]["pool_fills"] > 0
    assert filled["outputs"] == plain_outputs
    assert filled["proposals"] != pooled["proposals"]
    forwards = [n for step in filled["fills"] for n in step]
    assert forwards and max(forwards) <= filled["max_num_tokens"]
    assert any(len(step) > 1 for step in filled["fills"]), "a step's rows in two forwards"
    assert sum(forwards) == filled["stats"]["pool_fills"] * 32


def test_the_fill_writes_the_draft_kv_of_its_chunks(prompts, full, filled):
    """The first layer's KV depends on a token and its position only: at
    each of the first two requests' last steps every chunk their selections
    may read (the sinks, the pool, the chunks the refreshes filled and the
    window) holds the full pass's first-layer KV, and the fills went past
    the pool and the window the prompt's end allowed. The second request
    fills as the second row of a forward (its next token read by offset)."""
    for (_, last), (_, reference), prompt in zip(filled["last"].items(),
                                                  full["last"].items(), prompts,
                                                  strict=False):
        chunks = len(prompt) // 32
        allowed = [c for c in range(chunks) if last["allowed"][c]]
        first_window = min(c for c in range(max(last["pool"]) + 1, chunks + 1)
                           if all(last["allowed"][c:chunks]))
        sinks = range(CMR.get("sink_tokens", 32) // 32)
        grown = set(allowed) - set(last["pool"]) - set(sinks) - set(
            range(first_window, chunks))
        assert len(grown) > 0, "chunks the fills added"
        same = [torch.allclose(last["kv"][c], reference["kv"][c], rtol=1e-4, atol=1e-5)
                for c in range(chunks)]
        assert all(same[c] for c in allowed), "where the views may read"


FILL_CONTEXT = ("SPECEXTEND_FILL_CONTEXT", "1")


def test_filled_chunks_with_the_ones_before_them(tiny_target, prompts, plain_outputs):
    """``SPECEXTEND_FILL_CONTEXT``: each refresh fills twice the chunks, each
    chosen one with the one before it, and output stays plain decoding's.
    The target drafts for itself here (two layers: ``tiny_draft``'s one
    layer's KV depends on a token and its position only): wherever both runs
    filled a chunk its first layer's KV is the same, and its last layer's,
    which depends on what the chunk read, now its predecessor too, differs
    somewhere."""
    alone = _run(tiny_target, tiny_target, prompts, POOL, fill=FILL)
    context = _run(tiny_target, tiny_target, prompts, POOL, fill=FILL,
                   env=(FILL_CONTEXT,))
    assert alone["outputs"] == context["outputs"] == plain_outputs
    assert context["stats"]["pool_fills"] == 2 * alone["stats"]["pool_fills"] > 0
    forwards = [n for step in context["fills"] for n in step]
    assert forwards and all(n % (2 * FILL * 32) == 0 for n in forwards)
    changed = 0
    for (_, last), (_, before), prompt in zip(context["last"].items(),
                                              alone["last"].items(), prompts,
                                              strict=False):
        both = [c for c in range(len(prompt) // 32)
                if last["allowed"][c] and before["allowed"][c]]
        assert all(torch.allclose(last["kv"][c], before["kv"][c], rtol=1e-4,
                                  atol=1e-5) for c in both)
        changed += sum(not torch.allclose(last["kv_last"][c], before["kv_last"][c],
                                          rtol=1e-4, atol=1e-5) for c in both)
    assert changed > 0, "a filled chunk's last-layer KV saw its predecessor"


def test_a_pool_of_chunks_with_the_ones_before_them(tiny_target, prompts,
                                                   plain_outputs):
    """``SPECEXTEND_POOL_CONTEXT``: the pool is its top half's chunks, each
    with the one before it (unless a sink or chosen already): at least half
    of its chunks follow another of its chunks or a sink, fewer without the
    switch. Output stays plain decoding's."""
    run = _run(tiny_target, tiny_target, prompts, POOL, fill=FILL,
               env=(FILL_CONTEXT, ("SPECEXTEND_POOL_CONTEXT", "1")))
    alone = _run(tiny_target, tiny_target, prompts, POOL, fill=FILL)
    assert run["outputs"] == plain_outputs
    sinks = CMR.get("sink_tokens", 32) // 32

    def runs(pool):
        return sum(c - 1 in pool or c - 1 < sinks for c in pool)

    pool = run["seen"]["pool"]
    assert len(set(pool)) == POOL
    assert runs(pool) >= POOL // 2 > runs(alone["seen"]["pool"])


def test_a_fill_that_follows_the_chunks_read(tiny_target, prompts, plain_outputs):
    """``SPECEXTEND_FILL_FOLLOW=1``: the fill ranks each chunk by the most mass
    of itself and the chunk before it, so it takes the chunks after those the
    target reads (the pool's, at the first fill): there most of the first
    request's filled chunks follow a chunk of its pool or of the fill, more
    than without the switch. Output stays plain decoding's."""
    run = _run(tiny_target, tiny_target, prompts, POOL, fill=FILL,
               env=(("SPECEXTEND_FILL_FOLLOW", "1"),))
    alone = _run(tiny_target, tiny_target, prompts, POOL, fill=FILL)
    assert run["outputs"] == plain_outputs

    def following(run):
        first = run["fill_chunks"][0][0]  # the first step's first row: request 0
        held = set(run["seen"]["pool"]) | set(first)
        return sum(c - 1 in held for c in first)

    assert following(run) > FILL // 2 >= following(alone)


def test_a_growing_pool_replays_the_draft_routine_after_its_fill(
        tiny_target, tiny_draft, prompts, plain_outputs, filled):
    """``draft_graph: static``: steps whose pools grow run the fill's forward,
    then the routine's code, and draft what the eager path drafts."""
    static = _run(tiny_target, tiny_draft, prompts, POOL, draft_graph="static",
                  fill=FILL)
    assert static["stats"]["pool_fills"] == filled["stats"]["pool_fills"]
    assert static["stats"]["graph_steps"] > 0
    assert static["proposals"] == filled["proposals"], "the same drafts, step by step"
    assert static["outputs"] == plain_outputs
