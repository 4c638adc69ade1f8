"""Results files: merging, the lossless check, and markdown tables.

A results file is ``{"meta": ..., "rows": [...]}``. Rows of the ``eval``,
``cost`` and ``sweep`` tasks describe one run (a dataset, an input length, a
mode and its SpecExtend config over several prompts); ``needle`` rows describe
one prompt. Prompts and outputs are stored as short hashes, so files from
separate runs (say one per dataset, or one per mode) can be merged and still
checked against plain decoding.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict

from benchmarks.longinput import copytasks, engine

MODE_ORDER = {"none": 0, "draft_model": 1, "streaming": 2, "cmr": 3,
              "streaming_compact": 4, "cmr_compact": 5, "self_full": 6,
              "self_streaming": 7, "self_cmr": 8, "ngram": 9}


def working_set(config: dict | None) -> int | None:
    """Tokens a view keeps besides the tokens added since its last refresh:
    sinks, retrieved chunks and the recent window (None without a view)."""
    if not config or config.get("policy") == "full":
        return None
    return (config["sink_tokens"] + config["top_k"] * config["chunk_size"]
            + config["recent_tokens"])


def token_hash(ids) -> str:
    return hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:16]


def merge(results: list[dict]) -> dict:
    """One result from several files; the first file's meta, the others' under
    ``merged``. A run repeated in a later file (a call cut short, then resumed)
    replaces the earlier one."""
    meta = dict(results[0]["meta"])
    if len(results) > 1:
        meta["merged"] = [result["meta"] for result in results[1:]]
    latest = {}
    for row in (row for result in results for row in result["rows"]):
        latest[run_key(row)] = row
    rows = list(latest.values())
    count_mismatches(rows)
    return {"meta": meta, "rows": rows}


def run_key(row: dict) -> tuple:
    """What identifies a run: task, inputs, mode and config; needle rows are
    one per prompt (and key: a screened row holds no hashes)."""
    config = row["config"]
    if config is not None:  # a file from before score_layer ran the final one
        config = {**config, "score_layer": engine_score_layer(row)}
    return (row["task"], row["dataset"], row["length"], row["mode"],
            json.dumps(config, sort_keys=True), row.get("depth"),
            row.get("key"), tuple(row["prompt_hashes"]))


def count_mismatches(rows: list[dict]) -> None:
    """Set ``mismatches`` on every speculative run: how many of its greedy
    outputs differ from plain decoding's (``none``) on the same prompt; None
    where no plain run of any of its prompts exists. A plain row's
    ``prefix_hashes`` (the copy tasks') are the outputs that runs cut short
    at that prefix must produce."""
    plain = {}
    for r in rows:
        if r["mode"] == "none":
            for prompt, *outputs in zip(r["prompt_hashes"], r["output_hashes"],
                                        r.get("prefix_hashes") or r["output_hashes"],
                                        strict=True):
                plain[prompt] = set(outputs)
    for row in rows:
        if row["mode"] == "none":
            continue
        pairs = [(out, plain[p]) for p, out in zip(row["prompt_hashes"],
                                                    row["output_hashes"], strict=True)
                 if p in plain]
        row["mismatches"] = sum(a not in b for a, b in pairs) if pairs else None


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: list[str], lines: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(v) for v in line) + " |" for line in lines]
    return "\n".join(out)


def _key(row) -> tuple:
    layer = score_layer(row)
    return (row["dataset"], row["length"], MODE_ORDER[row["mode"]],
            row.get("working_set") or 0, -1 if layer is None else layer)


def context_share(row) -> float | None:
    stats = row.get("spec_extend_stats")
    if not stats or not stats["full_context_tokens"]:
        return None
    return 100.0 * stats["draft_context_tokens"] / stats["full_context_tokens"]


def interval(row) -> str | None:
    """The accepted length's bootstrap interval as "lo–hi" (None: too few
    batches, or a file from before it was recorded)."""
    ci = row.get("accepted_length_ci95")
    return None if ci is None else f"{ci[0]:.2f}–{ci[1]:.2f}"


def coverage_percent(row, key: str) -> float | None:
    """A ``WorkingSetProbe`` figure of the row in percent (None: not probed)."""
    coverage = row.get("coverage")
    value = coverage and coverage.get(key)
    return None if value is None else 100.0 * value


def eval_table(rows: list[dict]) -> str:
    rows = sorted((r for r in rows if r["task"] == "eval"), key=_key)
    plain = {(r["dataset"], r["length"]): r for r in rows if r["mode"] == "none"}
    lines = []
    for r in rows:
        base = plain.get((r["dataset"], r["length"]))
        speedup = r["decode_tok_s"] / base["decode_tok_s"] if base else None
        lines.append([
            r["dataset"], r["length"], r["prompt_len"], r["mode"],
            r.get("working_set"), score_layer(r), r["mean_accepted_length"], interval(r),
            r["acceptance_rate"], r["decode_tok_s"], r["e2e_tok_s"], speedup,
            context_share(r), coverage_percent(r, "top_held"),
            coverage_percent(r, "mass_held"), r.get("mismatches"),
        ])
    return _table(
        ["dataset", "length", "prompt tokens", "mode", "working set",
         "scoring layer", "accepted length", "95% interval",
         "acceptance rate", "decode tok/s", "e2e tok/s", "decode speedup vs none",
         "draft context %", "top chunk held %", "attention held %",
         "mismatches vs none"],
        lines,
    )


def copy_table(rows: list[dict]) -> str:
    """quote / edit runs: every prompt a run ran (``copy-summary`` keeps
    only those answered right)."""
    runs = sorted((r for r in rows if r["task"] in copytasks.TASKS),
                  key=lambda r: (r["task"], *_key(r)))
    lines = [[
        r["task"], r["dataset"], r["length"], r["prompt_len"], r["mode"],
        r.get("working_set"), score_layer(r), r["num_prompts"], sum(r["correct"]),
        r["mean_accepted_length"], r["tokens_per_forward"], interval(r),
        r["decode_tok_s"], r.get("mismatches"),
    ] for r in runs]
    return _table(
        ["task", "dataset", "length", "prompt tokens", "mode", "working set",
         "scoring layer", "prompts run", "answered right",
         "accepted length (drafted steps)", "tokens per forward",
         "95% interval (drafted steps)", "decode tok/s", "mismatches vs none"],
        lines,
    )


def cost_table(rows: list[dict]) -> str:
    """CMR's retrieval cost next to the draft step, full KV vs CMR."""
    runs = [r for r in rows if r["task"] in ("eval", "cost")]
    full = {(r["dataset"], r["length"]): r for r in runs if r["mode"] == "draft_model"}
    lines = []
    for r in sorted((r for r in runs if r["mode"] == "cmr"), key=_key):
        stats = r["spec_extend_stats"]
        steps, retrievals = stats["retrieval_steps"], stats["retrievals"]
        ms = 1000.0 * stats["scoring_seconds"]
        base = full.get((r["dataset"], r["length"]))
        lines.append([
            r["dataset"], r["length"], base["draft_step_ms"] if base else None,
            r["draft_step_ms"], ms / steps if steps else None,
            ms / retrievals if retrievals else None,
            steps / stats["decode_rows"] if stats["decode_rows"] else None,
            context_share(r),
        ])
    return _table(
        ["dataset", "length", "draft step ms (full KV)", "draft step ms (CMR)",
         "retrieval ms per scoring step", "ms per retrieval (one request)",
         "scoring steps per draft row", "draft context %"],
        lines,
    )


def sweep_table(rows: list[dict]) -> str:
    runs = sorted(
        (r for r in rows if r["task"] == "sweep"),
        key=lambda r: (r["dataset"], r["length"], r["config"]["chunk_size"],
                       r["config"]["top_k"], r["config"]["retrieve_every"]),
    )
    lines = [[
        r["dataset"], r["length"], r["config"]["chunk_size"], r["config"]["top_k"],
        r["config"]["retrieve_every"], r["mean_accepted_length"],
        r["acceptance_rate"], r["decode_tok_s"], r["draft_step_ms"], context_share(r),
        r.get("mismatches"),
    ] for r in runs]
    return _table(
        ["dataset", "length", "chunk", "top-k", "retrieve every", "accepted length",
         "acceptance rate", "decode tok/s", "draft step ms", "draft context %",
         "mismatches vs none"],
        lines,
    )


def shared_gpu(result: dict) -> bool:
    """Whether any run of a result (or of a file merged into it) shared its
    GPU with other evaluations (host_run.sh's side_by_side, in
    benchmarks/gpu/phases/common.sh): its tok/s are no speed results."""
    meta = result.get("meta") or {}
    return any((m.get("config") or {}).get("shared_gpu")
               for m in [meta, *meta.get("merged", [])])


def engine_score_layer(row: dict) -> int | None:
    """The scoring layer of the engine that ran a SpecExtend row (-1 in files
    from before the key); None without the plugin."""
    config = row.get("config")
    return None if config is None else config.get("score_layer", -1)


def score_layer(row: dict) -> int | None:
    """The layer shown beside a row: the one that ranked a retrieving row's
    chunks, or that a row's coverage figures were scored with; None where
    the layer changed nothing."""
    if engine.policy(row["mode"]) == "cmr" or row.get("coverage"):
        return engine_score_layer(row)
    return None


def needle_summary(rows: list[dict], over_depths: bool = False) -> list[dict]:
    """Per (length, depth, mode, working set, scoring layer): target accuracy
    and the draft's scores on the prompts the target answered;
    ``reproduced``: cases whose every key digit the draft proposed right, of
    those answered. ``over_depths``: one row per (length, mode, working set,
    scoring layer) over every depth run, ``depth`` "all"."""
    groups = defaultdict(list)
    for r in rows:
        if r["task"] == "needle":
            key = (r["length"], "all" if over_depths else r["depth"], r["mode"],
                   r.get("working_set"), score_layer(r))
            groups[key].append(r)
    out = []
    for (length, depth, mode, budget, layer), group in sorted(
        groups.items(),
        key=lambda kv: (kv[0][0], 0 if over_depths else kv[0][1], MODE_ORDER[kv[0][2]],
                        kv[0][3] or 0, kv[0][4] if kv[0][4] is not None else -1),
    ):
        answered = [r for r in group if r["target_correct"]]
        proposed = sum(r["proposed"] for r in answered)
        scored = [r for r in answered if r["all_matched"] is not None]
        out.append({
            "length": length, "depth": depth, "mode": mode, "working_set": budget,
            "score_layer": layer, "prompts": len(group),
            "target_accuracy": len(answered) / len(group),
            "token_match_rate": (sum(r["matched"] for r in answered) / proposed
                                 if proposed else None),
            "all_digits_rate": (sum(r["all_matched"] for r in scored) / len(scored)
                                if scored else None),
            "reproduced": f"{sum(bool(r['all_matched']) for r in answered)} of {len(answered)}",
            # Screened cases ran nothing to compare.
            "replay_consistent": all(r["replay_consistent"] for r in group
                                     if r["replay_consistent"] is not None),
        })
    return out


def needle_table(rows: list[dict]) -> str:
    header = ["length", "depth", "mode", "working set", "scoring layer", "prompts",
              "target correct", "draft token match", "draft all digits",
              "keys reproduced", "replay = counters"]

    def lines(summary):
        return [[s["length"], s["depth"], s["mode"], s["working_set"], s["score_layer"],
                 s["prompts"], s["target_accuracy"], s["token_match_rate"],
                 s["all_digits_rate"], s["reproduced"], s["replay_consistent"]]
                for s in summary]

    return (_table(header, lines(needle_summary(rows))) + "\n\nOver every depth:\n\n"
            + _table(header, lines(needle_summary(rows, over_depths=True))))


def markdown(result: dict) -> str:
    meta = result["meta"]
    rows = result["rows"]
    tasks = {r["task"] for r in rows}
    parts = []
    if "hardware" in meta:
        parts.append(
            f"{meta['hardware']['device']}, vLLM {meta['vllm']}, "
            f"torch {meta['torch']}, "
            f"{meta['date_utc']}, commit {meta['git_commit']}; target "
            f"`{meta['models']['target']['path']}`, draft "
            f"`{meta['models']['draft']['path']}`; "
            f"K={meta['config']['num_spec_tokens']}."
        )
    if shared_gpu(result):
        parts.append("Other evaluations shared the GPU during this run: its tok/s "
                     "columns are no speed results (accepted lengths and outputs "
                     "are unaffected).")
    parts.append(
        "Accepted length counts the bonus token (tokens per target forward, "
        "1 + accepted / drafts; plain decoding: 1). Decode tok/s excludes the "
        "prefill and first token; e2e tok/s includes them."
    )
    if "eval" in tasks:
        parts += ["## Accepted length and speed", eval_table(rows)]
    if tasks & {"eval", "cost"} and any(r["mode"] == "cmr" for r in rows):
        parts += ["## CMR cost", cost_table(rows)]
    if "sweep" in tasks:
        parts += ["## Sweep (chunk size x top-k x retrieve every)", sweep_table(rows)]
    if "needle" in tasks:
        parts += ["## Passkey retrieval by the draft", needle_table(rows)]
    if tasks & set(copytasks.TASKS):
        parts += ["## Copy tasks (quote, edit)", copy_table(rows)]
    return "\n\n".join(parts) + "\n"
