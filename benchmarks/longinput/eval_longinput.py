"""Long-input evaluation of SpecExtend with real models, through vLLM in-process.

Tasks (``run --tasks``, any subset; they share the engines):

* ``eval``: GovReport / PG-19 summarization prompts at each input length;
  per (dataset, length, mode) the mean accepted length, acceptance rate,
  decode and end-to-end tokens/s, and greedy equality with plain decoding.
* ``sweep``: CMR at one length over chunk size x top-k x retrieve_every.
* ``needle``: a pass key at several depths of a PG-19 haystack; how often the
  draft reproduces it under full KV, streaming and CMR, and whether the target
  answered.
* ``cost``: CMR's scoring time per retrieval and the draft step, full KV vs CMR,
  at each length (from the eval runs when ``eval`` runs too).
* ``quote`` / ``edit`` (``longinput.copytasks``): the answer repeats a
  paragraph from 10-90% deep in the prompt, verbatim or with a name renamed.
  The first run of a case (plain decoding) finds how much of its answer
  quotes the expected text; the other modes run the cases where that span is
  long enough (``--copy-min-tokens``), and only the span. Per run the same
  figures as ``eval`` and, per case, the span and its target forwards.
  ``copy-summary`` turns the files into tokens per target forward over the
  spans, mode by mode, with per-prompt pairs.

Modes: ``none`` (no speculation), ``draft_model`` (vLLM's draft model, full
KV, plugin off), ``streaming`` and ``cmr`` (``--spec-extend`` policies), and on
request ``streaming_compact`` / ``cmr_compact`` (the same with
``compact_positions: true``), ``self_*`` (the target drafts for itself) and
``ngram`` (vLLM's prompt lookup, plugin off). One engine per kind
(``engine.KINDS``) and scoring layer (``--score-layers``: fixed when an engine
starts); a spec_extend engine switches policy and parameters between runs with
``harness.drafter.reconfigure``.

    python -m benchmarks.longinput.eval_longinput run --target T --draft D --out R.json
    python -m benchmarks.longinput.eval_longinput run ... --tasks sweep needle cost
    python -m benchmarks.longinput.eval_longinput report R1.json R2.json \\
        --out merged.json
    python -m benchmarks.longinput.eval_longinput run ... --tasks quote edit
    python -m benchmarks.longinput.eval_longinput copy-summary R.json ... --out S.json

Writes R.json (rows + metadata) and R.md (tables) after every run, so a run
cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import drafter as access
from benchmarks.harness.meta import run_metadata
from benchmarks.longinput import (
    acceptance,
    copysummary,
    copytasks,
    engine,
    inputs,
    needle,
    report,
)

TASKS = ("eval", "sweep", "needle", "cost", *copytasks.TASKS)
DEFAULT_SPEC_EXTEND = {"chunk_size": 32, "top_k": 32, "retrieve_every": 4,
                       "sink_tokens": 32, "recent_tokens": 256, "min_context": 0}


@dataclass
class Run:
    task: str
    mode: str
    dataset: str
    length: int
    prompts: list[list[int]]
    max_new_tokens: int
    batch_size: int
    config: dict | None = None
    depth: float | None = None
    keys: list[str] = field(default_factory=list)
    cases: list[copytasks.CopyCase] = field(default_factory=list)
    stop: list[str] | None = None  # stop strings (the same in every mode)


# --------------------------------------------------------------------------- #
# planning
# --------------------------------------------------------------------------- #
def prompt_len(args, length: int, new_tokens: int) -> int:
    """Input length used for ``length``: capped so prompt + output fit the
    models' context with K + 1 positions to spare (SmolLM2: 8192 positions, so
    "8K" is 8192 - 256 - 5 tokens at K = 4).

    Near the end of the context vLLM 0.26 drafts less than the recorder
    replays: its scheduler trims a step's drafts to the positions left, from
    a position that async scheduling overstates (it counts the last step's
    drafts as accepted), and it skips the drafter once the longest row plus
    K would pass the draft's length (``_input_fits_in_drafter``), verifying
    zeros in their place. The 8K rows of 2026-11-26 disagreed with vLLM's
    counters so (GPU only: the CPU schedules synchronously). With K + 1
    positions to spare no step is trimmed or skipped."""
    return min(length, args.max_model_len - new_tokens - args.num_spec_tokens - 1)


def spec_config(args, mode: str, working_set: int | None = None,
                **overrides) -> dict | None:
    if mode not in engine.SPEC_EXTEND_MODES:
        return None
    budget = {} if working_set is None else working_set_config(args, working_set)
    config = {**args.spec_extend, **budget, **overrides,
              "policy": engine.policy(mode)}
    if mode.endswith("_compact"):
        config["compact_positions"] = True
    if mode in engine.SELF_DRAFT_MODES:
        config["self_draft"] = True
    return config


def working_set_config(args, tokens: int) -> dict:
    """A working set of ``tokens``: the sinks, a recent window of
    ``--window-share`` of it (a quarter by default), and as many retrieved
    chunks as fill the rest (``streaming`` spends the chunks' share on its
    window, so both policies see ``tokens`` tokens)."""
    chunk, sink = args.spec_extend["chunk_size"], args.spec_extend["sink_tokens"]
    recent = int(tokens * args.window_share) // chunk * chunk
    top_k = (tokens - sink - recent) // chunk
    if top_k < 1 or sink + recent + top_k * chunk != tokens:
        raise ValueError(
            f"a working set of {tokens} tokens does not split into {sink} sink "
            f"tokens, a window and whole {chunk}-token chunks"
        )
    return {"top_k": top_k, "recent_tokens": recent}


def budgets(args, mode: str) -> list[int | None]:
    """Working sets a mode runs at: each of ``--working-sets`` for the view
    policies, none (the config as given) otherwise."""
    if args.working_sets and engine.policy(mode) in ("streaming", "cmr"):
        return list(args.working_sets)
    return [None]


def score_layers(args, mode: str) -> list[dict]:
    """``--score-layers``: a retrieving (cmr) mode runs at each layer, another
    SpecExtend mode at the first (its drafts rank nothing; one engine serves
    it); without the option, the config's layer."""
    if not args.score_layers or mode not in engine.SPEC_EXTEND_MODES:
        return [{}]
    if engine.policy(mode) == "cmr":
        return [{"score_layer": layer} for layer in args.score_layers]
    return [{"score_layer": args.score_layers[0]}]


def mode_configs(args, mode: str) -> list[dict | None]:
    """The configs a mode runs with: one per working set and scoring layer."""
    return [spec_config(args, mode, budget, **layer)
            for budget in budgets(args, mode) for layer in score_layers(args, mode)]


def plan(args, tokenizer) -> list[Run]:
    runs: list[Run] = []
    modes = args.modes
    tasks = set(args.tasks)
    if "eval" in tasks:
        for dataset, length in itertools.product(args.datasets, args.lengths):
            prompts = inputs.summary_prompts(
                tokenizer, dataset, prompt_len(args, length, args.max_new_tokens),
                args.num_prompts)
            runs += [Run("eval", mode, dataset, length, prompts, args.max_new_tokens,
                         args.batch_size, config)
                     for mode in modes for config in mode_configs(args, mode)]
    if "cost" in tasks:
        dataset = args.datasets[0]
        for length in args.lengths:
            for mode in [m for m in ("draft_model", "cmr") if m in modes]:
                if any(r.task == "eval" and (r.dataset, r.length, r.mode)
                       == (dataset, length, mode) for r in runs):
                    continue  # the eval run measures it already
                prompts = inputs.summary_prompts(
                    tokenizer, dataset,
                    prompt_len(args, length, args.max_new_tokens), args.cost_prompts)
                runs.append(Run("cost", mode, dataset, length, prompts,
                                args.max_new_tokens, args.batch_size,
                                spec_config(args, mode)))
    if "sweep" in tasks:
        runs += sweep_runs(args, tokenizer)
    if "needle" in tasks:
        runs += needle_runs(args, tokenizer)
    runs += copy_runs(args, tokenizer)
    return runs


def copy_runs(args, tokenizer) -> list[Run]:
    """``quote`` / ``edit``: each mode on the same cases, batch size 1 (a
    paired interval over prompts)."""
    runs = []
    for task, source, length in itertools.product(
        [t for t in copytasks.TASKS if t in args.tasks], args.copy_sources,
        args.copy_lengths,
    ):
        cases = copytasks.cases(tokenizer, task, source,
                                prompt_len(args, length, args.copy_new_tokens),
                                args.copy_prompts)
        runs += [Run(task, mode, source, length, [c.prompt for c in cases],
                     args.copy_new_tokens, 1, config, cases=cases,
                     stop=[copytasks.SEPARATOR])
                 for mode in args.modes for config in mode_configs(args, mode)]
    return runs


def sweep_runs(args, tokenizer) -> list[Run]:
    chunks = [c for c in args.sweep_chunk_sizes if c % args.block_size == 0]
    skipped = sorted(set(args.sweep_chunk_sizes) - set(chunks))
    if skipped:
        print(f"sweep: chunk sizes {skipped} skipped (not multiples of the KV "
              f"block size {args.block_size})", file=sys.stderr)
    dataset = args.datasets[0]
    prompts = inputs.summary_prompts(
        tokenizer, dataset, prompt_len(args, args.sweep_length, args.max_new_tokens),
        args.sweep_prompts)
    sink = args.spec_extend["sink_tokens"]
    runs = []
    for chunk, top_k, every in itertools.product(
        chunks, args.sweep_top_k, args.sweep_retrieve_every
    ):
        # Sinks are whole chunks: round them up to the chunk size.
        config = spec_config(args, "cmr", chunk_size=chunk, top_k=top_k,
                             retrieve_every=every,
                             sink_tokens=-(-sink // chunk) * chunk)
        runs.append(Run("sweep", "cmr", dataset, args.sweep_length, prompts,
                        args.max_new_tokens, args.batch_size, config))
    return runs


def needle_runs(args, tokenizer) -> list[Run]:
    def encode(text):
        return inputs.encode(tokenizer, text)

    runs = []
    modes = [m for m in args.modes if m != "none"]
    for length, depth in itertools.product(args.needle_lengths, args.needle_depths):
        n = prompt_len(args, length, args.needle_new_tokens)
        keys = [needle.pass_key(args.seed, i) for i in range(args.needle_prompts)]
        prompts = [
            needle.needle_prompt(encode, inputs.haystack(tokenizer, n, i), key,
                                 depth, n)
            for i, key in enumerate(keys)
        ]
        runs += [Run("needle", mode, "pg19", length, prompts, args.needle_new_tokens,
                     1, config, depth, keys)
                 for mode in modes for config in mode_configs(args, mode)]
    return runs


# --------------------------------------------------------------------------- #
# execution
# --------------------------------------------------------------------------- #
def starting_config(runs: list[Run]) -> dict | None:
    """The config an engine starts with: the run needing the most compaction
    scratch (sinks + chunks), which is sized at start-up; ``reconfigure``
    switches to a smaller working set but cannot grow it."""
    from vllm_specextend.config import SpecExtendConfig

    configs = [r.config for r in runs if r.config]
    return max(configs, default=None,
               key=lambda c: SpecExtendConfig.from_dict(c).draft_budget_tokens)


class Session:
    """One engine and its instruments; runs ``Run``s and returns rows."""

    def __init__(self, args, kind: str, runs: list[Run], tokenizer,
                 missed: set | None = None, spans: dict | None = None):
        self.args = args
        # --needle-screen: the passkey cases (length, depth, haystack) the
        # target missed in an earlier run; shared by every session.
        self.missed = missed
        # The copy cases' quoted spans (tokens) where they count, None where
        # they do not, by (task, dataset, length, prompt hash), from the first
        # run of each; shared by every session.
        self.spans = {} if spans is None else spans
        self.kind = kind
        self.tokenizer = tokenizer
        self.llm = engine.build(settings(args), kind, starting_config(runs))
        self.drafter = access.drafter(self.llm) if kind != "none" else None
        self.timer = access.ProposeTimer(self.drafter) if self.drafter else None
        needs_recorder = any(r.task == "needle" for r in runs)
        self.recorder = access.DraftRecorder(self.llm) if needs_recorder else None
        self.probe = (access.WorkingSetProbe(self.drafter)
                      if args.coverage and engine.is_spec_extend(kind) else None)
        self.warm_up(runs)

    def warm_up(self, runs: list[Run]) -> None:
        """One short request on the longest prompt, CMR on where it applies:
        kernels compile and caches fill before anything is timed."""
        longest = max(runs, key=lambda r: len(r.prompts[0]))
        cmr = next((r for r in runs if r.mode.startswith("cmr")), longest)
        self.configure(cmr)
        engine.generate(self.llm, [longest.prompts[0]], self.params(8))

    def params(self, max_tokens: int, stop: list[str] | None = None):
        from vllm import SamplingParams

        return SamplingParams(max_tokens=max_tokens, temperature=0.0,
                              ignore_eos=self.args.ignore_eos, stop=stop)

    def configure(self, run: Run) -> None:
        if engine.is_spec_extend(self.kind):
            access.reconfigure(self.drafter, run.config)

    def snapshot(self) -> dict:
        return {
            "counters": acceptance.spec_counters(self.llm) if self.drafter else None,
            "stats": (access.stats(self.drafter)
                      if engine.is_spec_extend(self.kind) else None),
        }

    def delta(self, before: dict) -> dict:
        after = self.snapshot()
        counters = (acceptance.counter_delta(before["counters"], after["counters"])
                    if self.drafter else None)
        stats = (access.stats_delta(before["stats"], after["stats"])
                 if engine.is_spec_extend(self.kind) else None)
        return {"counters": counters, "stats": stats}

    def execute(self, run: Run, progress) -> list[dict]:
        self.configure(run)
        if run.task in copytasks.TASKS:
            return self.copy_rows(run, progress)
        if run.task != "needle":
            return [self.run_row(run, progress)]
        rows = []
        for i in range(len(run.prompts)):
            case = (run.length, run.depth, i)
            if self.missed is not None and case in self.missed:
                rows.append(screened_row(run, i))
            else:
                rows.append(self.needle_row(run, i))
                if self.missed is not None and not rows[-1]["target_correct"]:
                    self.missed.add(case)
            progress.update(1)
        return rows

    def run_row(self, run: Run, progress) -> dict:
        return self.measure(run, run.prompts, progress)[0]

    def copy_rows(self, run: Run, progress) -> list[dict]:
        """A row of the copy cases that count (none if no case does): the
        first run of a case (plain decoding where it runs: it runs first)
        finds the span of its answer that quotes the expected text
        (``copytasks.score``); a later run generates only that span (the same
        greedy tokens in every mode), and only where the case counts. Beside
        ``run_row``'s figures, per case: whether the whole answer was right,
        the span, where the paragraph sat, and plain decoding's answers."""
        def key(i):
            return (run.task, run.dataset, run.length,
                    report.token_hash(run.prompts[i]))

        picked = [i for i in range(len(run.prompts))
                  if self.spans.get(key(i), 0) is not None]
        progress.update(len(run.prompts) - len(picked))
        if not picked:
            return []
        budgets = [self.spans.get(key(i)) or run.max_new_tokens for i in picked]
        row, outputs = self.measure(run, [run.prompts[i] for i in picked], progress,
                                    budgets)
        cases = [run.cases[i] for i in picked]
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=True)
        scores = [copytasks.score(c, decode, o, self.args.copy_min_tokens)
                  for c, o in zip(cases, outputs, strict=True)]
        for i, got in zip(picked, scores, strict=True):
            self.spans.setdefault(key(i), got["copied_tokens"] if got["kept"] else None)
        return [{
            **row,
            "screened_out": len(run.prompts) - len(picked),
            **{k: [got[k] for got in scores] for k in ("correct", "copied_tokens",
                                                        "kept")},
            # What a run of the spans alone must reproduce (report.count_mismatches).
            "prefix_hashes": [report.token_hash(o[:got["copied_tokens"]])
                              for o, got in zip(outputs, scores, strict=True)],
            "depths": [c.depth for c in cases],
            "paragraph_at": [c.at for c in cases],
            "paragraph_tokens": [c.paragraph_tokens for c in cases],
            "renamed": [[c.old, c.new] for c in cases] if run.task == "edit" else None,
            "answers": [decode(o) for o in outputs] if run.mode == "none" else None,
        }]

    def measure(self, run: Run, prompts: list[list[int]], progress,
                budgets: list[int] | None = None) -> tuple[dict, list[list[int]]]:
        """Generates ``prompts`` in batches: the run's row, and the outputs.
        ``budgets``: new tokens per batch (default: the run's)."""
        before = self.snapshot()
        if self.timer:
            self.timer.take_ms()
            self.timer.enabled = True
        if self.probe:
            self.probe.enabled = True
        batches, units = [], []
        for n, b in enumerate(range(0, len(prompts), run.batch_size)):
            batch = prompts[b:b + run.batch_size]
            params = self.params(budgets[n] if budgets else run.max_new_tokens,
                                 run.stop)
            counted = acceptance.spec_counters(self.llm) if self.drafter else None
            batches.append(engine.generate(self.llm, batch, params))
            if counted is not None:
                units.append(acceptance.counter_delta(
                    counted, acceptance.spec_counters(self.llm)))
            progress.update(1)
        coverage = self.probe.take() if self.probe else None
        if self.probe:
            self.probe.enabled = False
        step_ms = self.timer.take_ms() if self.timer else []
        if self.timer:
            self.timer.enabled = False
        delta = self.delta(before)
        outputs = [out for batch in batches for out in batch.outputs]
        decode_s = sum(b.decode_s for b in batches)
        e2e_s = sum(b.e2e_s for b in batches)
        decode_tokens = sum(b.decode_tokens for b in batches)
        total = sum(map(len, outputs))
        forwards = [f for batch in batches for f in batch.forwards]
        return {
            **describe(run, prompts),
            "output_tokens": total,
            "decode_tokens": decode_tokens,
            "decode_s": decode_s,
            "e2e_s": e2e_s,
            "decode_tok_s": decode_tokens / decode_s if decode_s else None,
            "e2e_tok_s": total / e2e_s,
            **acceptance.summarize(delta["counters"]),
            # Over batches (prompts, at batch size 1): the spread between them.
            "accepted_length_ci95": acceptance.accepted_length_interval(units),
            "batch_counters": [{k: u[k] for k in acceptance.COUNTERS} for u in units],
            "coverage": coverage,
            "spec_decode": delta["counters"],
            "draft_step_ms": statistics.median(step_ms) if step_ms else None,
            "draft_steps": len(step_ms),
            "spec_extend_stats": delta["stats"],
            **self.resolved_pool(),
            # Per request: output tokens and target forwards after the first
            # token; tokens per forward is the accepted length of any drafter
            # (vLLM's counters skip the steps that drafted nothing).
            "output_lens": [len(o) for o in outputs],
            "forwards": forwards,
            "tokens_per_forward": ((total - len(outputs)) / sum(forwards)
                                   if sum(forwards) else None),
            "prompt_hashes": [report.token_hash(p) for p in prompts],
            "output_hashes": [report.token_hash(o) for o in outputs],
        }, outputs

    def resolved_pool(self) -> dict:
        """What draft_prompt_pool became on this engine ("auto" resolved; a
        row's ``config`` keeps the run's own): None, the draft's full pass.
        Nothing for an engine without SpecExtend."""
        if not engine.is_spec_extend(self.kind):
            return {}
        return {"draft_prompt_pool": access.config(self.drafter).draft_prompt_pool}

    def needle_row(self, run: Run, i: int) -> dict:
        before = self.snapshot()
        self.recorder.enabled = True
        batch = engine.generate(self.llm, [run.prompts[i]],
                                self.params(run.max_new_tokens))
        self.recorder.enabled = False
        delta = self.delta(before)
        counters = delta["counters"]
        output = batch.outputs[0]
        steps = acceptance.replay(self.recorder.take(batch.request_ids[0]), output,
                                  room=self.args.max_model_len - len(run.prompts[i]))
        status = needle.skip_first_step(acceptance.token_status(steps, len(output)),
                                        steps)
        span = needle.key_tokens(self.tokenizer.decode, output, run.keys[i])
        return {
            **describe(run, [run.prompts[i]]),
            "depth": run.depth,
            "key": run.keys[i],
            "answer": self.tokenizer.decode(output),
            **needle.score(status, span),
            **acceptance.summarize(counters),
            "replay_consistent": acceptance.replay_agrees(steps, len(output), counters),
            "spec_decode": counters,
            # Whether the draft's pass over this prompt was pooled
            # (pooled_prompt_passes) and what the engine's pool became.
            "spec_extend_stats": delta["stats"],
            **self.resolved_pool(),
            "replay": {"steps": len(steps),
                       "accepted": sum(s.accepted for s in steps)},
            "prompt_hashes": [report.token_hash(run.prompts[i])],
            "output_hashes": [report.token_hash(output)],
        }

    def close(self) -> None:
        engine.shutdown(self.llm)


def screened_row(run: Run, i: int) -> dict:
    """A passkey case an earlier run showed the target misses
    (``--needle-screen``). Greedy output is the same in every mode, so it is
    not generated again: the row counts the case, scores nothing, and holds
    no hashes (it is no evidence of equality)."""
    return {
        **describe(run, [run.prompts[i]]),
        "depth": run.depth,
        "key": run.keys[i],
        "answer": None,
        **needle.score([], None),
        "screened": True,
        "replay_consistent": None,
        "prompt_hashes": [],
        "output_hashes": [],
    }


def describe(run: Run, prompts=None) -> dict:
    prompts = run.prompts if prompts is None else prompts
    return {
        "task": run.task, "dataset": run.dataset, "length": run.length,
        "prompt_len": len(prompts[0]), "mode": run.mode, "config": run.config,
        "working_set": report.working_set(run.config),
        "num_prompts": len(prompts), "batch_size": run.batch_size,
        "max_new_tokens": run.max_new_tokens,
    }


def settings(args) -> engine.EngineSettings:
    tokens_per_step = args.batch_size * (args.num_spec_tokens + 1)
    return engine.EngineSettings(
        target=args.target,
        draft=args.draft,
        num_spec_tokens=args.num_spec_tokens,
        dtype=args.dtype,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        max_num_seqs=args.batch_size,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        seed=args.seed,
        max_num_batched_tokens=args.max_num_batched_tokens,
        ngram_max=args.ngram_max,
        ngram_min=args.ngram_min,
        # Decode steps verify batch * (K + 1) tokens: capture only those sizes.
        cudagraph_sizes=sorted({*range(1, 9), *range(8, tokens_per_step + 8, 8)}),
    )


def model_info(path: str) -> dict:
    config = json.loads((Path(path) / "config.json").read_text())
    info = {"path": path, **{k: config.get(k) for k in (
        "num_hidden_layers", "hidden_size", "max_position_embeddings", "dtype")}}
    # "dtype" is the unquantized layers'; a quantized checkpoint says so here.
    if config.get("quantization_config"):
        info["quantization_config"] = config["quantization_config"]
    recipe = Path(path) / "recipe.json"
    if recipe.is_file():
        info["recipe"] = json.loads(recipe.read_text())
    return info


def metadata(args) -> dict:
    draft = model_info(args.draft) if args.draft else {"path": "(self_draft only)"}
    return run_metadata(args, models={"target": model_info(args.target),
                                      "draft": draft})


def write(out: Path, result: dict) -> None:
    report.count_mismatches(result["rows"])
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(report.markdown(result))


def engines(runs: list[Run]) -> dict[tuple[str, int | None], list[Run]]:
    """The runs of each engine, in ``engine.KINDS`` order (plain decoding
    first: the copy tasks and ``--needle-screen`` learn from it): one per
    kind and scoring layer, which is fixed when an engine starts."""
    groups: dict[tuple[str, int | None], list[Run]] = {}
    for r in runs:
        layer = report.engine_score_layer({"config": r.config})
        groups.setdefault((engine.engine_kind(r.mode), layer), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: engine.KINDS.index(kv[0][0])))


def run(args) -> int:
    from tqdm import tqdm
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.target)
    runs = plan(args, tokenizer)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"meta": metadata(args), "rows": []}
    missed = set() if args.needle_screen else None
    spans: dict = {}
    # Progress in batches; a needle prompt is a batch of its own.
    total = sum(len(r.prompts) if r.task == "needle"
                else -(-len(r.prompts) // r.batch_size) for r in runs)
    with tqdm(total=total, desc="eval", unit="batch") as progress:
        for (kind, layer), mine in engines(runs).items():
            at = "" if layer in (None, -1) else f", layer {layer}"
            progress.set_postfix_str(f"starting {kind} engine{at}")
            session = Session(args, kind, mine, tokenizer, missed, spans)
            for r in mine:
                progress.set_postfix_str(f"{r.task} {r.mode} {r.dataset} {r.length}")
                result["rows"] += session.execute(r, progress)
                write(out, result)
            session.close()
    print(out.with_suffix(".md").read_text())
    mismatched = sum(r.get("mismatches") or 0 for r in result["rows"])
    if mismatched:
        print(f"{mismatched} greedy outputs differ from plain decoding "
              "(bf16 near-ties can do this; fp32 must not)", file=sys.stderr)
    return 0


def merge_reports(args) -> int:
    result = report.merge([json.loads(Path(p).read_text()) for p in args.files])
    write(Path(args.out), result)
    print(Path(args.out).with_suffix(".md").read_text())
    return 0


def _eval_rows(files: list[str]) -> list[dict]:
    """The batch-1 eval rows of ``files``, each with ``_draft``: what drafted
    (the file's draft, or the target itself for ``self_*`` modes), K and the
    new tokens, so rows pair only within one drafter's runs. A run repeated
    in a later file replaces the earlier one, as in ``report``."""
    rows = {}
    for path in files:
        result = json.loads(Path(path).read_text())
        meta = result.get("meta") or {}
        draft = ((meta.get("models") or {}).get("draft") or {}).get("path")
        k = (meta.get("config") or {}).get("num_spec_tokens")
        for r in result["rows"]:
            if r["task"] == "eval" and r["batch_size"] == 1:
                tag = ("self" if r["mode"].startswith("self_") else draft, k,
                       r.get("max_new_tokens"))
                rows[(report.run_key(r), r.get("working_set"), tag)] = {**r, "_draft": tag}
    return list(rows.values())


# Config keys that shape every policy's drafts besides the working set's split
# (recent_tokens / top_k, matched through the working set).
DRAFT_SHAPE = ("chunk_size", "sink_tokens", "retrieve_every", "min_context")


def paired_report(args) -> int:
    """Each eval row against the ``--baseline`` mode's row of the same
    dataset and length on the same prompts (any of the files): per-prompt
    pairs, so the interval is of the ratio, not of two separate means. A row
    with a working set is paired with the baseline of the same working set
    (CMR at 512 tokens against streaming at 512), one without (full KV) with
    each; plain decoding (no drafts) with none. Rows pair only within one
    drafter's runs (the same draft, K, new tokens, chunking). A row pairs with
    the baseline its own engine ran (the same scoring layer); a baseline whose
    drafts no layer ranks (streaming, full KV) stands in for an engine that
    did not run it, so a later call can run only the retrieving mode: one
    baseline per row and working set, the default layer's first."""
    rows = _eval_rows(args.files)
    bases = [r for r in rows if r["mode"] == args.baseline]
    lends = engine.policy(args.baseline) != "cmr"

    def same_cell(r: dict, base: dict) -> bool:
        shape = [tuple(c.get(k) for k in DRAFT_SHAPE)
                 for c in (r["config"], base["config"]) if c]
        return ((r["dataset"], r["length"], r["prompt_hashes"], r["_draft"])
                == (base["dataset"], base["length"], base["prompt_hashes"], base["_draft"])
                and r.get("working_set") in (None, base.get("working_set"))
                and (len(shape) < 2 or shape[0] == shape[1]))

    def pick(r: dict, found: list[dict]) -> dict | None:
        layer = report.engine_score_layer(r)
        own = [b for b in found if report.engine_score_layer(b) == layer]
        if own or not lends:
            return own[0] if own else None
        return min(found, key=lambda b: report.engine_score_layer(b) != -1)

    out = []
    for r in rows:
        if r["mode"] in (args.baseline, "none"):
            continue
        by_working_set: dict = {}
        for b in bases:
            if same_cell(r, b):
                by_working_set.setdefault(b.get("working_set"), []).append(b)
        for found in by_working_set.values():
            base = pick(r, found)
            if base is None:
                continue
            pair = acceptance.paired_ratio(r["batch_counters"], base["batch_counters"])
            out.append({"dataset": r["dataset"], "length": r["length"], "mode": r["mode"],
                        "working_set": r.get("working_set"),
                        # A window and chunks only where there is a working set.
                        **{k: (r["config"] or {}).get(k) if r.get("working_set") else None
                           for k in ("recent_tokens", "top_k")},
                        "score_layer": report.score_layer(r),
                        "accepted_length": r["mean_accepted_length"],
                        "baseline": args.baseline,
                        "baseline_working_set": base.get("working_set"),
                        "baseline_score_layer": report.engine_score_layer(base),
                        # Only a row whose engine ranks with a layer borrows
                        # (vLLM's draft_model runs on an engine of its own).
                        "baseline_borrowed": (report.engine_score_layer(r) is not None
                                              and report.engine_score_layer(base)
                                              != report.engine_score_layer(r)),
                        "baseline_accepted_length": base["mean_accepted_length"],
                        **(pair or {})})
    # Side by side: each cell's modes and layers at one working set together.
    out.sort(key=lambda o: (o["dataset"], o["length"], o["baseline_working_set"] or 0,
                            report.MODE_ORDER[o["mode"]],
                            -1 if o["score_layer"] is None else o["score_layer"]))
    lines = [f"Against `{args.baseline}` on the same prompts: ratio of accepted lengths, "
             "95% bootstrap interval drawing prompts for both, prompts that drafted "
             "better. A baseline \"from layer L\" was run by another scoring layer's "
             f"engine (its drafts rank nothing). From: {', '.join(args.files)}.", "",
             "| dataset | length | mode | working set | window | chunks | scoring layer "
             "| accepted length | baseline (working set) | ratio | 95% interval | better |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for o in out:
        low, high = o.get("interval") or (float("nan"),) * 2
        source = (f", from layer {o['baseline_score_layer']}"
                  if o["baseline_borrowed"] and o["baseline_score_layer"] is not None else "")
        lines.append(f"| {o['dataset']} | {o['length']} | {o['mode']} | {o['working_set'] or '–'} "
                     f"| {o['recent_tokens'] or '–'} | {o['top_k'] or '–'} "
                     f"| {'–' if o['score_layer'] is None else o['score_layer']} "
                     f"| {o['accepted_length']:.2f} | {o['baseline_accepted_length']:.2f} "
                     f"({o['baseline_working_set']}{source}) "
                     f"| {o.get('ratio', float('nan')):.3f} "
                     f"| {low:.3f}–{high:.3f} | {o.get('better')} of {o.get('prompts')} |")
    Path(args.out).write_text(json.dumps({"files": args.files, "baseline": args.baseline,
                                          "rows": out}, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def paired_needle(args) -> int:
    """``needle.paired`` of two needle runs, as a table."""
    rows = needle.paired(json.loads(Path(args.base).read_text())["rows"],
                         json.loads(Path(args.other).read_text())["rows"])
    lines = [f"Passkey cases of `{args.other}` against `{args.base}`: accepted "
             "length, other over base (95% bootstrap interval drawing cases for "
             "both), keys reproduced, greedy outputs equal.", "",
             "| scoring layer | cases | n | ratio | 95% interval | other better "
             "| keys reproduced, base → other | equal outputs |",
             "|---|---|---|---|---|---|---|---|"]
    for o in rows:
        low, high = o.get("interval") or (float("nan"),) * 2
        lines.append(f"| {'final' if o['score_layer'] in (None, -1) else o['score_layer']} "
                     f"| {o['cases']} | {o['n']} | {o.get('ratio', float('nan')):.3f} "
                     f"| {low:.3f}–{high:.3f} | {o.get('better')} "
                     f"| {o['keys_base']} → {o['keys_other']} "
                     f"| {o['equal_outputs']} of {o['n']} |")
    print("\n".join(lines))
    return 0


def copy_summary(args) -> int:
    summary = copysummary.summary(
        {path: json.loads(Path(path).read_text()) for path in args.files})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=1) + "\n")
    out.with_suffix(".md").write_text(copysummary.summary_markdown(summary))
    print(out.with_suffix(".md").read_text())
    return 0


def model_limit(*paths: str) -> int:
    configs = [json.loads((Path(p) / "config.json").read_text()) for p in paths]
    return min(c["max_position_embeddings"] for c in configs)


def parse_args(argv=None):
    import torch

    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the evaluation tasks")
    r.add_argument("--target", required=True)
    r.add_argument("--draft", help="the draft model (not needed by self_* modes)")
    r.add_argument("--out", required=True, help="results JSON (tables: same stem, .md)")
    r.add_argument("--tasks", nargs="+", choices=TASKS, default=["eval"])
    r.add_argument("--modes", nargs="+", choices=engine.MODES,
                   default=list(engine.DEFAULT_MODES))
    r.add_argument("--datasets", nargs="+", choices=inputs.DATASETS,
                   default=["govreport", "pg19"])
    r.add_argument("--lengths", nargs="+", type=int,
                   default=[512, 1024, 2048, 4096, 8192])
    r.add_argument("--num-prompts", type=int, default=20)
    r.add_argument("--max-new-tokens", type=int, default=256)
    r.add_argument("--batch-size", type=int, default=1,
                   help="requests of one length run in batches of this size")
    r.add_argument("--num-spec-tokens", "-K", type=int, default=4)
    r.add_argument("--spec-extend", type=json.loads, default={},
                   help="SpecExtend config for streaming/cmr, over "
                   f"{DEFAULT_SPEC_EXTEND}")
    r.add_argument("--working-sets", type=int, nargs="+", default=[],
                   help="run the streaming/cmr modes at each of these working-set "
                   "sizes in tokens (sinks + chunks + window)")
    r.add_argument("--window-share", type=float, default=0.25,
                   help="share of each --working-sets budget given to the recent "
                   "window under cmr (the rest: sinks and retrieved chunks)")
    r.add_argument("--score-layers", type=int, nargs="+", default=[],
                   help="run the cmr modes at each of these scoring layers "
                   "(score_layer), an engine each; other SpecExtend modes run at "
                   "the first (default: the --spec-extend config's layer)")
    r.add_argument("--ngram-max", type=int, default=4,
                   help="ngram mode: vLLM's prompt_lookup_max")
    r.add_argument("--ngram-min", type=int, default=2,
                   help="ngram mode: vLLM's prompt_lookup_min")
    r.add_argument("--coverage", action="store_true",
                   help="eval rows: what each draft step's working set held of "
                        "the target's attention in the scoring layer "
                        "(score_layer; harness.drafter.WorkingSetProbe); scores "
                        "every row every step, so draft times include it")
    r.add_argument("--ignore-eos", action="store_true",
                   help="always generate --max-new-tokens (default: stop at EOS)")
    r.add_argument("--cost-prompts", type=int, default=5)
    r.add_argument("--sweep-length", type=int, default=8192)
    r.add_argument("--sweep-prompts", type=int, default=5)
    r.add_argument("--sweep-chunk-sizes", type=int, nargs="+", default=[16, 32, 64])
    r.add_argument("--sweep-top-k", type=int, nargs="+", default=[8, 16, 32, 64])
    r.add_argument("--sweep-retrieve-every", type=int, nargs="+", default=[1, 4, 8])
    r.add_argument("--needle-lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    r.add_argument("--needle-depths", type=float, nargs="+",
                   default=[0.1, 0.3, 0.5, 0.7, 0.9])
    r.add_argument("--needle-prompts", type=int, default=8,
                   help="haystacks (and keys) per length and depth")
    r.add_argument("--needle-new-tokens", type=int, default=24)
    r.add_argument("--needle-screen", action="store_true",
                   help="run a passkey case in later modes only if the target "
                   "found the key in the first (greedy output is the same in "
                   "every mode): many haystacks for the few the target answers")
    r.add_argument("--copy-lengths", type=int, nargs="+", default=[2048, 4096, 8192],
                   help="quote / edit: input lengths")
    r.add_argument("--copy-sources", nargs="+", choices=copytasks.SOURCES,
                   default=["govreport"], help="quote / edit: the text")
    r.add_argument("--copy-prompts", type=int, default=20,
                   help="quote / edit: cases per task, source and length, at "
                   "depths spread over 10-90%%")
    r.add_argument("--copy-new-tokens", type=int, default=128,
                   help="quote / edit: the longest answer (paragraphs have at "
                   "most 96 tokens; an answer ends at a blank line)")
    r.add_argument("--copy-min-tokens", type=int, default=16,
                   help="quote / edit: a case counts where the first run's "
                   "answer quotes at least this many tokens of the expected "
                   "text (and, for edit, past the first renamed name); later "
                   "modes run only those cases, and only that span")
    r.add_argument("--dtype", default="bfloat16" if cuda else "float32")
    r.add_argument("--block-size", type=int, default=16 if cuda else 32)
    r.add_argument("--max-model-len", type=int,
                   help="default: the models' max_position_embeddings")
    r.add_argument("--kv-cache-memory-bytes", type=int,
                   default=(4 if cuda else 1) << 30)
    r.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    r.add_argument("--max-num-batched-tokens", type=int,
                   help="prefill chunk size (default: vLLM's)")
    r.add_argument("--enforce-eager", action="store_true", default=not cuda)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--shared-gpu", action="store_true",
                   help="other evaluations run on the GPU at the same time "
                   "(host_run.sh side_by_side): the tables say tok/s are no "
                   "speed results")
    m = sub.add_parser("report", help="merge results files into one (JSON + .md)")
    m.add_argument("files", nargs="+")
    m.add_argument("--out", required=True)
    pr = sub.add_parser("paired", help="each mode against a baseline mode on the "
                        "same prompts (JSON + .md)")
    pr.add_argument("files", nargs="+")
    pr.add_argument("--baseline", default="self_streaming")
    pr.add_argument("--out", required=True)
    pn = sub.add_parser("paired-needle", help="two needle runs of the same "
                        "cases, case by case (a table on stdout)")
    pn.add_argument("base")
    pn.add_argument("other")
    cs = sub.add_parser("copy-summary", help="quote / edit: accepted length per "
                        "task, length and mode over the cases that count, and "
                        "paired ratios (JSON + .md)")
    cs.add_argument("files", nargs="+")
    cs.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        from vllm_specextend.config import SpecExtendConfig

        args.spec_extend = {**DEFAULT_SPEC_EXTEND, **args.spec_extend}
        SpecExtendConfig.from_dict(args.spec_extend)  # fail before any engine starts
        separate = [m for m in args.modes if engine.engine_kind(m)
                    not in ("none", "self_draft", "ngram")]
        if separate and not args.draft:
            parser.error(f"modes {separate} need --draft")
        for tokens in args.working_sets:
            working_set_config(args, tokens)
        models = [args.target] + ([args.draft] if args.draft else [])
        args.max_model_len = args.max_model_len or model_limit(*models)
    return args


def main(argv=None) -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    args = parse_args(argv)
    if args.command == "paired":
        return paired_report(args)
    if args.command == "paired-needle":
        return paired_needle(args)
    if args.command == "copy-summary":
        return copy_summary(args)
    return run(args) if args.command == "run" else merge_reports(args)


if __name__ == "__main__":
    sys.exit(main())
