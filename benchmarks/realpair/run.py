"""One mode of the real-pair grid through ``LLM(...).generate``, as users run it.

Each call starts one engine (vLLM's defaults: prefix caching, CUDA graphs,
``torch.compile``, the model's 32,768 positions), warms it up on a short
prompt, then answers the task set's cells (``tasks.py``) one after another:
at batch 1 one ``generate`` per prompt, at batch 8 one per eight prompts,
greedy, each prompt fresh: no two prompts share a start, and the prefix
cache is emptied (``reset_prefix_cache``) after the warm-up and before each
cell, so a batch-8 cell's prompts, answered at batch 1 before, prefill again;
``suffix`` also forgets its cached responses there (``arctic.empty_responses``:
SuffixDecoding drafts from earlier requests' answers).

The one flag changed from vLLM's defaults in every mode: ``disable_log_stats
=False`` (the per-request first-token times and the spec-decode counters).
Modes (``MODES``; the row's ``mode`` and ``k``):

* ``plain``: no speculation.
* ``draft_model``: vLLM's draft model (the 0.5B), full KV, plugin off.
* ``ngram`` / ``ngram_gpu``: vLLM's prompt lookup (its default n-gram sizes).
* ``suffix``: vLLM's SuffixDecoding (its defaults: tree depth 24, 10,000
  responses cached across requests, spec factor 1.0, min token probability
  0.1), K its most tokens a step; it imports
  arctic-inference, which ``grid.sh`` puts on this mode's path alone, and
  runs with vLLM's general plugins cut to this project's (``arctic.py``).
* ``spec_extend``: ``draft_model`` plus ``--spec-extend`` with the plugin's
  defaults: what a user gets.
* ``spec_extend_window``: policy ``streaming`` (sinks + a recent window of the
  same budget), ``spec_extend_full_pass``: ``draft_prompt_pool: null`` and
  ``draft_prefill_window: null`` (the draft's pass over every prompt token,
  unwindowed), ``spec_extend_windowed_pass``: ``draft_prompt_pool: null``
  (the full pass windowed by ``draft_prefill_window`` "auto": the defaults
  from 2026-12-06 night to 2026-12-07, when the pool with its fill became
  them), ``spec_extend_pool``: ``"auto"`` alone (``draft_pool_fill: null``).
* variants: ``spec_extend_pool256`` (a pool of 256 chunks alone, no fill:
  twice ``"auto"``'s when top_k was 32),
  ``spec_extend_prefill_window`` (the full pass, each chunk reading the sinks
  and the 2,048 tokens before it: ``draft_prefill_window``, which turns the
  pool off; since 2026-12-06 night each piece of 1,024 inside a chunk too),
  ``spec_extend_pw4k`` (that with a window of 4,096, what ``"auto"`` became
  the same night), ``spec_extend_no_window`` (the full pass unwindowed, as
  ``spec_extend_full_pass``),
  ``spec_extend_follow15`` (the pool, ``"auto"``, chosen as the top chunks
  each with the 15 after it: ``SPECEXTEND_POOL_FOLLOW``),
  ``spec_extend_top64`` (a view of 64 chunks: acceptance nearer full KV's?),
  ``spec_extend_every2`` (a retrieval every 2 steps), ``spec_extend_vocab32k``
  (greedy drafts from the first 32,768 of the 151,936 ids: a cheaper draft
  ``lm_head``), ``spec_extend_lookup`` (``lookup_tokens: 5``: run as
  ``spec_extend_lookup:8``, 3 draft forwards a step and 5 tokens looked up
  in the request's own context) and ``spec_extend_lookup4`` (``lookup_tokens:
  4``: run as ``spec_extend_lookup4:5``, the step's one draft forward, the
  pass that keeps the draft's KV, and 4 looked up: the cheapest step, which
  tells whether drafts past the first pay on copy tasks),
  ``spec_extend_lookup_pw`` (``spec_extend_lookup`` with the prefill window
  of ``spec_extend_prefill_window``: run as ``spec_extend_lookup_pw:8``),
  ``spec_extend_lookup_pool`` (``spec_extend_lookup`` with ``"auto"``'s
  pooled pass: run as ``spec_extend_lookup_pool:8``),
  ``spec_extend_nolookup`` (``lookup_tokens: 0``, the control at K=8, where
  ``"auto"`` looks up 5), ``spec_extend_lookup_min1`` (``spec_extend_lookup``
  taking a match of 1 token where no longer one exists:
  ``SPECEXTEND_LOOKUP_MIN_MATCH``), ``spec_extend_fp8draft`` (the defaults
  with the draft's fp8 copy, ``fp8_draft``: per-tensor e4m3 weights of its
  linear layers), ``spec_extend_carry`` (``carry_drafts: 1``: a step after
  one whose lookup held drafts 1 token and looks up the rest; run at K=12,
  1 or 3 drafted, 11 or 9 looked up), ``spec_extend_carry_pw`` (that with
  ``spec_extend_prefill_window``'s window), ``spec_extend_carry_after4`` and
  ``spec_extend_carry_all`` (a row carries after a step that accepted 4 of
  its looked-up tokens, or every proposal: ``SPECEXTEND_CARRY_AFTER``),
  ``spec_extend_draft2`` (2 drafted at K=12, 10 looked up),
  ``spec_extend_min1`` (the defaults, the lookup taking a match of 1 token
  where no longer one exists),
  ``spec_extend_fill8`` and ``spec_extend_fill16`` (``draft_prompt_pool``
  ``"auto"`` grown by 8 or 16 chunks at each refresh: ``draft_pool_fill``;
  16 is lowered to the draft's largest CUDA graph), ``spec_extend_fill8_graphs``
  (fill 8, each fill forward within that graph: ``SPECEXTEND_FILL_IN_GRAPHS``),
  ``spec_extend_pool64_fill8`` (a pool of top_k's 64 chunks, fill 8),
  ``spec_extend_step15k`` (the defaults under vLLM's own step budget:
  ``max_num_batched_tokens`` 16,384 given, so 15,360 a step on an H100:
  ``MODE_ENGINE_ARGS``), ``spec_extend_room320`` (the defaults with 16,704
  tokens a step: room for 16 decoding rows' 20 speculative tokens beside a
  prompt plain computes in one step), and ``spec_extend_<name>`` with
  ``--spec-extend JSON``.
  Modes that name no ``lookup_tokens`` take ``"auto"``: off at K=4, K − 3
  looked up from K=8. Modes that name no ``draft_prompt_pool`` run the day's
  defaults beside their keys: the full pass until 2026-12-07, the pool and
  its fill since (a mode's resolved keys are in its file's meta,
  ``spec_extend_resolved``).

Per prompt it records the output ids, the answer's check (``tasks.check``),
end-to-end seconds (the ``generate`` call), first-token latency and decode
seconds (vLLM's request stats), the spec-decode counters' deltas (batch 1;
batch 8: per batch) and the GPU busy share (NVML) over the call; per cell,
the plugin's counters' growth (``cell_counters``: steps carried, replayed,
tokens looked up).

    python -m benchmarks.realpair.run --cases CASES --target DIR --draft DIR \\
        --mode spec_extend --k 4 --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmarks.harness.drafter import stats_delta, worker_state
from benchmarks.harness.gpu_busy import GpuBusy
from benchmarks.harness.meta import plugin_env, run_metadata
from benchmarks.harness.modes import Speculation, engine_settings
from benchmarks.longinput.acceptance import counter_delta, spec_counters
from benchmarks.realpair import arctic, tasks

MODES = ("plain", "draft_model", "ngram", "ngram_gpu", "suffix", "spec_extend",
         "spec_extend_window", "spec_extend_full_pass")
PLUGIN_CONFIGS = {
    "spec_extend": {},
    "spec_extend_window": {"policy": "streaming"},
    "spec_extend_full_pass": {"draft_prompt_pool": None, "draft_prefill_window": None},
    "spec_extend_windowed_pass": {"draft_prompt_pool": None},
    "spec_extend_pool": {"draft_prompt_pool": "auto", "draft_pool_fill": None},
    "spec_extend_pool256": {"draft_prompt_pool": 256, "draft_pool_fill": None},
    "spec_extend_prefill_window": {"draft_prefill_window": 2048},
    "spec_extend_follow15": {"draft_prompt_pool": "auto", "draft_pool_fill": None},
    "spec_extend_top64": {"top_k": 64},
    "spec_extend_every2": {"retrieve_every": 2},
    "spec_extend_vocab32k": {"draft_vocab": 32768},
    "spec_extend_lookup": {"lookup_tokens": 5},
    "spec_extend_lookup4": {"lookup_tokens": 4},
    # Both levers of the 2026-12-06 profile at once: fewer draft forwards a
    # step, and a draft pass over the prompt linear in its length.
    "spec_extend_lookup_pw": {"lookup_tokens": 5, "draft_prefill_window": 2048},
    # The lookup proposes from the request's tokens, not the draft's KV: does
    # it keep what the pooled pass (no draft KV outside the pool) loses? Its
    # control was spec_extend_lookup, the full pass until 2026-12-07.
    "spec_extend_lookup_pool": {"lookup_tokens": 5, "draft_prompt_pool": "auto",
                                "draft_pool_fill": None},
    "spec_extend_nolookup": {"lookup_tokens": 0},
    "spec_extend_lookup_min1": {"lookup_tokens": 5},
    "spec_extend_fp8draft": {},
    # Steps the lookup carries skip the draft's second and third forwards.
    "spec_extend_carry": {"carry_drafts": 1},
    "spec_extend_carry_pw": {"carry_drafts": 1, "draft_prefill_window": 2048},
    # The window inside a chunk (prompt_split.py, 2026-12-06 night): 2,048 is
    # spec_extend_prefill_window's; a wider one for the acceptance it keeps.
    "spec_extend_pw4k": {"draft_prefill_window": 4096},
    # The full pass, the default until draft_prefill_window became "auto".
    "spec_extend_no_window": {"draft_prompt_pool": None, "draft_prefill_window": None},
    "spec_extend_carry_after4": {"carry_drafts": 1},
    "spec_extend_carry_all": {"carry_drafts": 1},
    # Two drafted a step at K=12 (10 looked up): a third fewer draft forwards.
    "spec_extend_draft2": {"lookup_tokens": 10},
    # The defaults with vLLM's step budget (MODE_ENGINE_ARGS): before
    # serving/scheduling.plain_step_budget, 15,360 tokens a step on an H100.
    "spec_extend_step15k": {},
    # A step's budget with room for 16 decoding rows' 20 speculative tokens
    # beyond plain's 16,384 (MODE_ENGINE_ARGS): at K=20 the batch-8 cell's
    # 16.3K prompts stop fitting a step beside the rows decoding from the
    # sixth on (docs/evaluation.md, "A larger K").
    "spec_extend_room320": {},
    # The lookup's shortest match 1 (SPECEXTEND_LOOKUP_MIN_MATCH): replayed
    # on the 0050Z answers it looks up 3-19% more (lookup_replay.py).
    "spec_extend_min1": {},
    # The pool ("auto": 128 chunks, its first token) grown at every refresh by
    # the 8 or 16 chunks the target ranks top without draft KV (pool_fill.py);
    # fill8 is the defaults since 2026-12-07 (draft_pool_fill "auto").
    "spec_extend_fill8": {"draft_prompt_pool": "auto", "draft_pool_fill": 8},
    "spec_extend_fill16": {"draft_prompt_pool": "auto", "draft_pool_fill": 16},
    # fill8's, each fill forward within the draft's largest CUDA graph
    # (SPECEXTEND_FILL_IN_GRAPHS: pool_fill.rows_per_forward).
    "spec_extend_fill8_graphs": {"draft_prompt_pool": "auto", "draft_pool_fill": 8},
    # The smallest pool (top_k's 64 chunks: a first pass of ~2K tokens fewer
    # than "auto"'s 128), the fill to catch up: batch 8's first tokens wait on
    # each prompt's draft pass (2026-12-07, 0602Z: 0.81 s against plain's 0.56).
    "spec_extend_pool64_fill8": {"draft_prompt_pool": 64, "draft_pool_fill": 8},
    # fill8's, each filled chunk with the one before it (SPECEXTEND_FILL_CONTEXT:
    # selection.with_predecessors): 16 chunks a refresh, up to 8 of them context.
    "spec_extend_fillctx": {"draft_prompt_pool": "auto", "draft_pool_fill": 8},
    # The pool too: its top 64 chunks, each with the one before it
    # (SPECEXTEND_POOL_CONTEXT), and fillctx's fill.
    "spec_extend_ctx": {"draft_prompt_pool": "auto", "draft_pool_fill": 8},
    # fill8's, its chunks ranked by the most mass of themselves and the chunk
    # before (SPECEXTEND_FILL_FOLLOW=1): the chunk a copy reads next.
    "spec_extend_fillfollow1": {"draft_prompt_pool": "auto", "draft_pool_fill": 8},
    # Both: the chunks after those read, each with the one before it.
    "spec_extend_fillctx_follow1": {"draft_prompt_pool": "auto", "draft_pool_fill": 8},
}
MODE_ENGINE_ARGS = {
    "spec_extend_step15k": {"max_num_batched_tokens": 16384},
    "spec_extend_room320": {"max_num_scheduled_tokens": 16384 + 320,
                            "max_num_batched_tokens": 16384 + 320 + 1024},
}
"""A mode's own ``LLM`` arguments beyond vLLM's defaults (recorded with the
engine's arguments): ``max_num_batched_tokens`` given is a budget the user
set, which the plugin leaves to vLLM's rule (a slot per sequence off it,
1,024 for ``LLM``'s ``max_num_seqs``, unless ``max_num_scheduled_tokens`` is
given too)."""
FP8_DRAFT_MODES = ("spec_extend_fp8draft",)
"""Modes that run the draft's fp8 copy (``fp8_draft``): a prompt pass on fp8
GEMMs, the cost that keeps 30K and batch 8 near plain (2026-12-06)."""
PLUGIN_ENV = {"spec_extend_follow15": {"SPECEXTEND_POOL_FOLLOW": "15"},
              "spec_extend_lookup_min1": {"SPECEXTEND_LOOKUP_MIN_MATCH": "1"},
              "spec_extend_carry_after4": {"SPECEXTEND_CARRY_AFTER": "4"},
              "spec_extend_carry_all": {"SPECEXTEND_CARRY_AFTER": "all"},
              "spec_extend_min1": {"SPECEXTEND_LOOKUP_MIN_MATCH": "1"},
              "spec_extend_fill8_graphs": {"SPECEXTEND_FILL_IN_GRAPHS": "1"},
              "spec_extend_fillctx": {"SPECEXTEND_FILL_CONTEXT": "1"},
              "spec_extend_ctx": {"SPECEXTEND_FILL_CONTEXT": "1",
                                  "SPECEXTEND_POOL_CONTEXT": "1"},
              "spec_extend_fillfollow1": {"SPECEXTEND_FILL_FOLLOW": "1"},
              "spec_extend_fillctx_follow1": {"SPECEXTEND_FILL_CONTEXT": "1",
                                              "SPECEXTEND_FILL_FOLLOW": "1"},
              "suffix": arctic.SUFFIX_ENV}
"""A mode's environment, set in this process before the engine starts (its
processes inherit it) and recorded (meta ``mode_env``): a variant's
experiment switches (``drafting/tuning.py``, ``retrieval/selection.py``);
the ``suffix`` mode's plugin selection."""


def fp8_draft(draft: str) -> str:
    """Where the fp8 copy of ``draft`` lives: beside it, ``-fp8`` appended
    (``host.sh build`` writes it with ``benchmarks.models.builders fp8``)."""
    return f"{draft.rstrip('/')}-fp8"


def engine_kwargs(mode: str, target: str, draft: str, k: int,
                  spec_extend: dict | None = None) -> dict:
    """``LLM`` keyword arguments of ``mode``: vLLM's defaults plus stats and
    the mode's speculation (``harness.modes.engine_settings`` for plain,
    ``draft_model`` and the plugin's modes; prompt lookup here)."""
    kwargs: dict = {"model": target, "disable_log_stats": False}
    if mode in FP8_DRAFT_MODES:
        draft = fp8_draft(draft)
    if mode in ("ngram", "ngram_gpu", "suffix"):
        kwargs["speculative_config"] = {"method": mode, "num_speculative_tokens": k}
        return kwargs
    if mode not in ("plain", "draft_model") and not mode.startswith("spec_extend"):
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES} or spec_extend_<name>")
    config = None
    extra = MODE_ENGINE_ARGS.get(mode, {})
    if mode.startswith("spec_extend"):
        config = PLUGIN_CONFIGS.get(mode)
        if config is None and spec_extend is None:
            raise ValueError(f"mode {mode} needs --spec-extend JSON")
        config = {**(config or {}), **(spec_extend or {})}
        mode = "spec_extend"
    spec = Speculation(draft=draft, num_spec_tokens=k, spec_extend=config or {})
    return {**kwargs, **extra, **engine_settings(mode, spec)}


def request_times(output) -> dict:
    """First-token latency and decode seconds of one ``RequestOutput``."""
    m = output.metrics
    if m is None:
        return {"ttft_s": None, "decode_s": None, "first_ts": None, "last_ts": None}
    return {"ttft_s": m.first_token_latency,
            "decode_s": max(0.0, m.last_token_ts - m.first_token_ts),
            "first_ts": m.first_token_ts, "last_ts": m.last_token_ts}


def run_batch(llm, cases: list[tasks.Case], busy: GpuBusy, speculative: bool,
              call: int, batch: int) -> list[dict]:
    """One ``generate`` over ``cases`` (the run's ``call``-th); a record per case."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=c.max_tokens) for c in cases]
    prompts = [{"prompt_token_ids": list(c.prompt_ids)} for c in cases]
    before = spec_counters(llm) if speculative else None
    t0, m0 = time.perf_counter(), time.monotonic()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    e2e = time.perf_counter() - t0
    m1 = time.monotonic()
    delta = counter_delta(before, spec_counters(llm)) if speculative else None
    records = []
    for case, out in zip(cases, outputs, strict=True):
        text = out.outputs[0].text
        ids = list(out.outputs[0].token_ids)
        records.append({
            "id": case.id, "group": case.group, "kind": case.kind,
            "context": case.context, "prompt_tokens": case.prompt_tokens,
            "batch": batch, "call": call, "output_ids": ids, "output_tokens": len(ids),
            "answer": text, "right": tasks.check(case, text),
            "finish_reason": out.outputs[0].finish_reason,
            "e2e_s": e2e, **request_times(out),
            "gpu_busy": busy.share([(m0, m1)]),
            "spec": None if delta is None else {k: delta[k] for k in
                                                 ("drafts", "draft_tokens",
                                                  "accepted_tokens")},
        })
    return records


def warm_up(llm, case: tasks.Case) -> None:
    """A short prompt first (not measured): the first request of an engine
    pays lazy set-ups that no user request after it does."""
    from vllm import SamplingParams

    llm.generate([{"prompt_token_ids": list(case.prompt_ids[:2048])}],
                 SamplingParams(temperature=0.0, max_tokens=32), use_tqdm=False)


def empty_prefix_cache(llm) -> None:
    """The prefix cache emptied, so the next prompts are fresh, or stop."""
    if not llm.reset_prefix_cache():
        raise SystemExit("vLLM did not empty its prefix cache: prompts would not be fresh")


def select(cases: list[tasks.Case], cells: list[str]) -> list[tuple[str, int, list]]:
    """``group:context:batch[:count]`` cells (``*`` any) -> (group, batch,
    cases); ``count``: the cell's first cases only (a CPU probe's few)."""
    chosen = []
    for cell in cells:
        parts = cell.split(":")
        group, context, batch, count = parts + ["*", "*", "1", ""][len(parts):]
        picked = [c for c in cases
                  if group in ("*", c.group) and context in ("*", str(c.context))]
        if count:
            picked = picked[: int(count)]
        if not picked:
            raise SystemExit(f"cell {cell!r} matches no case")
        chosen.append((cell, int(batch), picked))
    return chosen


def resolved_keys(llm, kwargs: dict) -> dict | None:
    """What the plugin's ``"auto"`` keys became on this engine (rank 0's
    ``specextend_state``), and the pool fill fitted to the draft's graphs,
    for the result's meta; None without the plugin."""
    if "additional_config" not in kwargs:
        return None
    state = worker_state(llm)[0]
    return {key: state.get(key) for key in ("draft_prompt_pool", "draft_prefill_window",
                                            "lookup_tokens", "draft_pool_fill")}


def plugin_counters(llm, kwargs: dict) -> dict | None:
    """The plugin's counters on rank 0 (``specextend_state``'s ``stats``),
    taken around each cell: their growth (``cell_counters``) says how a
    mode ran there (steps carried, replayed, looked-up tokens); None
    without the plugin."""
    if "additional_config" not in kwargs:
        return None
    return worker_state(llm)[0]["stats"]


def write_result(args, header: dict, kwargs: dict, start_s: float, speculative: bool,
                 records: list[dict], resolved: dict | None = None,
                 cell_counters: dict | None = None) -> None:
    result = {
        "meta": run_metadata(args, engine_start_s=start_s, engine_kwargs=kwargs,
                             spec_extend_resolved=resolved,
                             plugin_env=plugin_env(),
                             mode_env=PLUGIN_ENV.get(args.mode, {}),
                             arctic_inference=(arctic.installed()
                                               if args.mode == "suffix" else None),
                             cases_sha256=header.get("sha256"),
                             cases_header=header),
        "mode": args.mode, "k": args.k if speculative else None,
        "records": records,
        "cell_counters": cell_counters or None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result) + "\n")
    tmp.replace(args.out)


def mode_parser(description: str) -> argparse.ArgumentParser:
    """The arguments that name a mode's engine (this script's and
    ``profile.py``'s): the task set, the pair, the mode, K, the plugin's
    config and, for CPU tests, more engine arguments."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--cases", required=True, type=Path)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--spec-extend", default=None, help="plugin config JSON")
    ap.add_argument("--engine-args", default=None,
                    help="more LLM keyword arguments as JSON (CPU tests: block_size, "
                         "kv_cache_memory_bytes, dtype; on a GPU only "
                         "load_format dummy, for a speed-only profile); recorded")
    return ap


def mode_kwargs(args) -> dict:
    """``LLM`` keyword arguments of ``mode_parser``'s parsed ``args``; the
    mode's environment (``PLUGIN_ENV``) goes into this process's environment
    first, for the engine to read (its processes inherit it). The ``suffix``
    mode stops here, with one line, where arctic-inference is missing."""
    problem = arctic.missing() if args.mode == "suffix" else None
    if args.mode in FP8_DRAFT_MODES:
        fp8 = fp8_draft(args.draft) if args.draft else None
        if fp8 is None:
            problem = f"{args.mode} needs --draft (its fp8 copy runs: fp8_draft)"
        elif not Path(fp8).is_dir():
            problem = (f"{args.mode} runs the draft's fp8 copy, and {fp8} is missing: "
                       f"python -m benchmarks.models.builders fp8 {args.draft} {fp8} "
                       "(host.sh build does)")
    if problem:
        raise SystemExit(problem)
    os.environ.update(PLUGIN_ENV.get(args.mode, {}))
    spec_extend = json.loads(args.spec_extend) if args.spec_extend else None
    kwargs = engine_kwargs(args.mode, args.target, args.draft, args.k, spec_extend)
    kwargs.update(json.loads(args.engine_args) if args.engine_args else {})
    return kwargs


def main(argv: list[str] | None = None) -> int:
    ap = mode_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--cells", nargs="+", default=["copy:16384:1"],
                    help="group:context:batch, e.g. copy:30720:1 other:16384:8")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)

    kwargs = mode_kwargs(args)
    header, cases = tasks.load_cases(args.cases)
    cells = select(cases, args.cells)
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - t0
    speculative = "speculative_config" in kwargs
    resolved = resolved_keys(llm, kwargs)
    warm_up(llm, cells[0][2][0])
    records, call, counters = [], 0, {}
    with GpuBusy() as busy:
        for cell, batch, picked in cells:
            empty_prefix_cache(llm)
            if args.mode == "suffix":  # its responses of earlier cells too
                print(f"suffix: {arctic.empty_responses(llm)} cached responses "
                      "evicted", flush=True)
            before = plugin_counters(llm, kwargs)
            done = []
            for i in range(0, len(picked), batch):
                done += run_batch(llm, picked[i:i + batch], busy, speculative,
                                  call=call, batch=batch)
                call += 1
            if before is not None:
                counters[cell] = stats_delta(before, plugin_counters(llm, kwargs))
            records += done
            tok = sum(r["output_tokens"] for r in done)
            calls = {r["call"]: r["e2e_s"] for r in done}
            print(f"{args.mode} k={args.k} {cell}: {len(done)} prompts, {tok} tokens, "
                  f"{tok / sum(calls.values()):.1f} tok/s end to end, "
                  f"{sum(r['right'] is True for r in done)} right", flush=True)
            # After every cell: a mode cut short keeps the cells it finished.
            write_result(args, header, kwargs, start_s, speculative, records, resolved,
                         counters)
    # vLLM's engine process is not a daemon and outlives this one unless shut
    # down (it would hold the GPU's memory from the next mode's engine): a
    # bounded shutdown, then ``os._exit`` past any hang in the rest of it.
    llm.llm_engine.engine_core.shutdown(timeout=10)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
