"""``benchmarks/results/summary.json`` from the committed result files, and the
headline tables rendered from it. Never edit either by hand: run this.

    python -m benchmarks.summarize                 # write summary.json
    python -m benchmarks.summarize --write README.md benchmarks/results/README.md
    python -m benchmarks.summarize --check README.md benchmarks/results/README.md

summary.json is a list of rows, one per (result file, mode, draft, context,
batch or concurrency): ``{"bench": "decode"|"serve", "device", "mode",
"draft", "context", "batch"|"concurrency", "tok_s": [one figure per run],
"gpu_busy": [one figure per run], "file"}``, plus ``"workload"`` (serve and
serve_rate),
``"synthetic_acceptance"`` (the synthetic acceptance length, None for real
rejection sampling) and ``"date_utc"``. Decode ``tok_s`` is decode tok/s;
decode rows from files whose runs time the first token also carry
``"e2e_tok_s"`` (all output tokens over the whole ``generate`` call) and
``"ttft_s"`` (time to first token), one figure per run, and
``"fresh_prompts"`` where the file says whether each run had prompts of its own
(true: the runs paid their prefill) or reused the warm-up's from the prefix
cache (false; no key: the file does not say). Serve
``tok_s`` is decode-phase tok/s (tokens after each request's first, over the
time some request was past its first token; ``[]`` for files from before the
serving bench measured it) with ``"output_tok_s"`` (output tok/s) beside it;
``context`` is the prompt length (a mixed workload's long one). ``gpu_busy`` is each
run's GPU busy share (0..1: the share of the run's decode window during which a
kernel ran, NVML, ``benchmarks.harness.gpu_busy``), None for a run without a
sample there (a CPU host); ``[]`` for files older than the sampler (before
2026-11-24), so every row has the key and ``[]`` tells "not measured" from
"measured, no sample". Files under ``results/archive/`` (superseded runs) are
left out.

A serving file's rows at a request rate (``bench_serve --request-rates``) are
``"bench": "serve_rate"`` rows, one per (result file, mode, draft, workload,
context, request rate): ``"request_rate"`` (requests/s, Poisson arrivals),
``"load"`` (its label: "low", "high" or None), ``"requests"`` (requests a
run), ``"goodput_slo"`` (the SLOs in
ms, e.g. ``{"ttft": 20000, "tpot": 50}``, or None), and per run: ``tok_s``
(output tok/s: every output token over the run's time), ``ttft_p50_ms``,
``tpot_p50_ms``, ``goodput`` (completed requests per second that met the
SLOs; None without SLOs) and ``in_flight`` (mean requests in flight). Their
headline tables give TPOT and TTFT p50 per (workload, context, load, queue,
requests a run) and rate, a column per mode; lower is better there, ratios
included. Runs of fewer requests are a cell of their own: a shorter run's
first and last requests overlap fewer others, so its latencies are not the
longer run's.

``--write`` replaces what lies between ``<!-- summary:start -->`` and
``<!-- summary:end -->`` in each file with the headline tables, one per bench
and device: for every cell the newest file's runs, median (min–max), linked to
that file, and after ``·`` the median GPU busy share of the runs that have one;
only runs at a synthetic acceptance (speed runs; real-acceptance runs check
correctness).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from benchmarks.harness.measure import QUEUE_GROWTH
from benchmarks.harness.meta import config_switches, device, tuning_switches
from benchmarks.harness.modes import LABELS as MODE_ORDER
from benchmarks.harness.modes import PLUGIN_MODES

RESULTS = Path(__file__).resolve().parent / "results"
SUMMARY = RESULTS / "summary.json"
START, END = "<!-- summary:start -->", "<!-- summary:end -->"


# --------------------------------------------------------------------------- #
# summary.json
# --------------------------------------------------------------------------- #
def _synthetic(config: dict) -> float | None:
    value = config.get("acceptance_length") or 0
    return value if value > 0 else None


def _busy(runs: list[dict]) -> list[float | None]:
    """Each run's GPU busy share, the least busy GPU's under tensor
    parallelism; [] where no run has the key (older files)."""
    if not any("gpu_busy" in run for run in runs):
        return []
    return [run.get("gpu_busy_min", run.get("gpu_busy")) for run in runs]


def _ttft(run: dict, batch: int) -> float | None:
    """A run's time to first token (its batch's last first token); files
    from before ``ttft_s`` have the median, the same figure at batch 1."""
    if "ttft_s" in run:
        return run["ttft_s"]
    return run.get("ttft_s_median") if batch == 1 else None


def variant(result: dict, mode: str, row: dict | None = None) -> str | None:
    """The tuning switches a mode's engine or server ran with, e.g.
    ``SPECEXTEND_DRAFT_AOT=0`` (or vLLM's ``VLLM_TEST_FORCE_FP8_MARLIN=1``),
    and what the file's plugin config set beyond the speed benches'
    (``draft_vocab=32768``); None where neither (the
    defaults of the file's commit). A serving row names its own server's
    switches (a merged file can hold the same mode with and without one);
    older rows go by every engine or server of the mode. The config names
    every row of its file, the baselines' too (as a switch in the process's
    environment does): an A/B's rows stay together, and its baselines do not
    displace the headline's same-session ratios. Variant rows stay out of the
    headline tables."""
    if row is not None and "plugin_env" in row:
        env = {**row["plugin_env"], **(row.get("vllm_env") or {})}
    else:
        env = {}
        for e in result.get("engines", []) + result.get("servers", []):
            if e.get("mode") == mode:
                env.update(e.get("plugin_env") or {})
                env.update(e.get("vllm_env") or {})
    config = config_switches(_plugin_config(result, mode))
    return " ".join(v for v in (tuning_switches(env), config) if v) or None


def _plugin_config(result: dict, mode: str) -> dict:
    """The file's plugin config (``--spec-extend``), with the draft placement
    a TP engine of ``mode`` resolved (``draft_placement: auto``) where it
    replicated its draft."""
    config = (result["meta"].get("config") or {}).get("spec_extend") or {}
    if isinstance(config, str):
        config = json.loads(config)
    if any(e.get("mode") == mode and e.get("draft_placement") == "replicated"
           for e in result.get("engines", [])):
        config = {**config, "draft_placement": "replicated"}
    return config


def decode_rows(result: dict, file: str) -> list[dict]:
    meta = result["meta"]
    rows = []
    for r in result["results"]:
        if "skipped" in r:
            continue
        runs = r.get("runs") or [r]  # older files: the row is its one run
        row = {"bench": "decode", "device": device(meta), "mode": r["mode"],
               "variant": variant(result, r["mode"]),
               "draft": r["draft"], "context": r["context"], "batch": r["batch"],
               "tok_s": [run["decode_tok_s"] for run in runs],
               "gpu_busy": _busy(runs), "file": file,
               "synthetic_acceptance": _synthetic(meta["config"]),
               "date_utc": meta["date_utc"]}
        # Files whose runs time the first token (fresh prompts by default).
        fresh = r.get("fresh_prompts", meta["config"].get("fresh_prompts"))
        ttft = [_ttft(run, r["batch"]) for run in runs]
        if all("ttft_s" in run for run in runs) or (
                fresh and None not in ttft and all("e2e_tok_s" in run for run in runs)):
            row["e2e_tok_s"] = [run["e2e_tok_s"] for run in runs]
            row["ttft_s"] = ttft
        if fresh is not None:
            row["fresh_prompts"] = fresh
        rows.append(row)
    return rows


def rate_row(result: dict, r: dict, ok: list[dict], file: str) -> dict:
    """The serve_rate row of a serving row at a request rate (its runs ``ok``)."""
    meta = result["meta"]
    return {"bench": "serve_rate", "device": device(meta), "mode": r["mode"],
            "variant": variant(result, r["mode"], r), "draft": r["draft"],
            "workload": r["workload"], "context": r["input_len"],
            "request_rate": r["request_rate"], "load": r.get("load"),
            "requests": r.get("num_prompts"), "goodput_slo": r.get("goodput_slo"),
            "tok_s": [run["output_throughput"] for run in ok],
            "ttft_p50_ms": [run["median_ttft_ms"] for run in ok],
            "tpot_p50_ms": [run["median_tpot_ms"] for run in ok],
            "goodput": [run.get("request_goodput") for run in ok],
            "in_flight": [run.get("in_flight") for run in ok],
            "ttft_growth": [run.get("ttft_growth") for run in ok],
            "queue": _queue(ok),
            "gpu_busy": _busy(ok), "file": file,
            "synthetic_acceptance": _synthetic(meta["config"]),
            "date_utc": meta["date_utc"]}


def _queue(runs: list[dict]) -> str | None:
    """"grew" where the runs' median ``ttft_growth`` passes
    ``measure.QUEUE_GROWTH`` (past the server's capacity: an overload, whatever
    its load label), "steady" below it, None where no run has the figure."""
    growth = [g for g in (run.get("ttft_growth") for run in runs) if g is not None]
    if not growth:
        return None
    return "grew" if statistics.median(growth) > QUEUE_GROWTH else "steady"


def serve_rows(result: dict, file: str) -> list[dict]:
    meta, cfg = result["meta"], result["meta"]["config"]
    rows = []
    if "results" in result:  # one row per (workload, mode, concurrency or rate)
        for r in result["results"]:
            ok = [run for run in r.get("runs", []) if "error" not in run]
            if not ok:
                continue
            if r.get("request_rate") is not None:
                rows.append(rate_row(result, r, ok, file))
                continue
            decode = [run.get("decode_tok_s") for run in ok]
            rows.append({"bench": "serve", "device": device(meta), "mode": r["mode"],
                         "variant": variant(result, r["mode"], r),
                         "draft": r["draft"], "workload": r["workload"],
                         "context": r["input_len"], "concurrency": r["concurrency"],
                         "tok_s": decode if None not in decode else [],
                         "output_tok_s": [run["output_throughput"] for run in ok],
                         "gpu_busy": _busy(ok), "file": file,
                         "synthetic_acceptance": _synthetic(cfg),
                         "date_utc": meta["date_utc"]})
        return rows
    # Older files: one run per row, one workload (short outputs) per file.
    for r in result["runs"]:
        if "error" in r:
            continue
        speculative = r["mode"] != "plain" and cfg["draft"]
        draft = Path(cfg["draft"]).name if speculative else None
        rows.append({"bench": "serve", "device": device(meta), "mode": r["mode"],
                     "draft": draft, "workload": "short", "context": cfg["input_len"],
                     "concurrency": r["concurrency"],
                     "tok_s": [], "output_tok_s": [r["output_throughput"]],
                     "gpu_busy": _busy([r]),
                     "file": file,
                     "synthetic_acceptance": _synthetic(cfg),
                     "date_utc": meta["date_utc"]})
    return rows


def kind(result: dict) -> str | None:
    """"decode", "serve", or None for other result files."""
    if not isinstance(result, dict) or "meta" not in result:
        return None
    bench = result["meta"].get("bench")
    if bench in ("decode", "serve"):
        return bench
    rows = result.get("results")
    if rows and isinstance(rows, list) and "decode_tok_s" in rows[0]:
        return "decode"
    runs = result.get("runs")
    if runs and isinstance(runs, list) and "concurrency" in runs[0]:
        return "serve"
    return None


def summarize(results_dir: Path | None = None) -> list[dict]:
    results_dir = results_dir or RESULTS
    rows = []
    for path in sorted(results_dir.rglob("*.json")):
        rel = path.relative_to(results_dir)
        if rel.parts[0] == "archive" or path == results_dir / SUMMARY.name:
            continue
        result = json.loads(path.read_text())
        bench = kind(result)
        if bench == "decode":
            rows += decode_rows(result, rel.as_posix())
        elif bench == "serve":
            rows += serve_rows(result, rel.as_posix())
    return rows


def dumps(rows: list[dict]) -> str:
    return json.dumps(rows, indent=1, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- #
# headline tables
# --------------------------------------------------------------------------- #
def file_age(file: str) -> tuple[str, str]:
    """Sort key of result files, oldest first: stamped names sort by time, and
    files all named results.json by their stamped folders."""
    return Path(file).name, file


def newest(rows: list[dict], key) -> dict:
    """Per key, the row of the newest file (``file_age``)."""
    out: dict = {}
    for r in sorted(rows, key=lambda r: file_age(r["file"])):
        out[key(r)] = r
    return out


def _cell(row: dict | None, link_base: Path | None, metric: str) -> str:
    if row is None:
        return "–"
    values = row[metric]
    # Milliseconds under 100 (a TPOT) keep a decimal; tok/s and longer times none.
    digits = 1 if metric.endswith("_ms") and statistics.median(values) < 100 else 0
    text = f"{statistics.median(values):.{digits}f}"
    text += (f" ({min(values):.{digits}f}–{max(values):.{digits}f})"
             if len(values) > 1 else " (1 run)")
    busy = _median_busy(row)
    if busy is not None:
        text += f" · {100 * busy:.0f}%"
    if link_base is None:
        return text
    return f"[{text}]({os.path.relpath(RESULTS / row['file'], link_base)})"


def _median_busy(row: dict) -> float | None:
    """Median GPU busy share of the row's runs that have one."""
    busy = [b for b in row.get("gpu_busy", []) if b is not None]
    return statistics.median(busy) if busy else None


def _ratio(a: dict | None, b: dict | None, metric: str) -> str:
    """a over b, only from one result file: a comparison is made in one run of
    the benchmark (one device session), never across sessions."""
    if a is None or b is None or a["file"] != b["file"]:
        return "–"
    return f"{statistics.median(a[metric]) / statistics.median(b[metric]):.2f}"


def _table(rows: list[dict], key_cols: list[str], x: str, link_base: Path | None,
           title: str, metric: str) -> str:
    """Rows keyed by ``key_cols`` + draft + ``x``; a column per mode; plain rows
    (no draft) serve every draft of their key; the last columns: SpecExtend over
    vLLM's own speculation and over plain decoding (and self_draft over plain)."""
    latest = newest(rows, lambda r: (*[r.get(c) for c in key_cols], r["draft"],
                                      r[x], r["mode"]))
    modes = [m for m in MODE_ORDER if any(r["mode"] == m for r in latest.values())]
    vllm_spec = [m for m in modes if m not in ("plain", *PLUGIN_MODES)]
    lines_keys = sorted({(*k[:-1],) for k, r in latest.items() if r["mode"] != "plain"},
                        key=lambda k: tuple((v is None, v) for v in k))
    head = [*key_cols, "draft", x, *modes,
            "spec_extend / " + (" or ".join(vllm_spec) or "draft_model"),
            "spec_extend / plain"]
    self_drafting = "self_draft" in modes
    if self_drafting:
        head.append("self_draft / plain")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in lines_keys:
        *keys, draft, xv = k
        cells = {m: latest.get((*keys, draft, xv, m)) for m in modes}
        # Plain from the file of the row's speculative cells where it has one,
        # spec_extend's first: the ratios divide only within one file.
        spec = cells.get("spec_extend")
        files = [spec["file"]] if spec else []
        files += sorted({c["file"] for c in cells.values() if c} - set(files))
        plain = [r for r in rows if r["mode"] == "plain"
                 and (*[r.get(c) for c in key_cols], r[x]) == (*keys, xv)]
        cells["plain"] = next(
            (r for f in files for r in plain if r["file"] == f),
            latest.get((*keys, None, xv, "plain")))
        base = next((cells[m] for m in vllm_spec if cells.get(m)), None)
        line = [*map(_fmt, keys), draft or "– (target)", _fmt(xv),
                *(_cell(cells.get(m), link_base, metric) for m in modes),
                _ratio(cells.get("spec_extend"), base, metric),
                _ratio(cells.get("spec_extend"), cells.get("plain"), metric)]
        if self_drafting:
            line.append(_ratio(cells.get("self_draft"), cells.get("plain"), metric))
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join([title, "", *lines])


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}K"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _busy_note(rows: list[dict]) -> str:
    """What ``· N%`` in a cell is, where a cell has it."""
    if not any(_median_busy(r) is not None for r in rows):
        return ""
    return (", then `· N%`: the median GPU busy share, the share of the decode "
            "window during which a kernel ran (NVML; cells without it predate "
            "the sampler)")


def _prompt_kind(row: dict) -> str:
    """A decode row's prompts: fresh (each run prefilled its own), cached (the
    prefix cache served the warm-up's) or – (a file older than the field)."""
    return {True: "fresh", False: "cached"}.get(row.get("fresh_prompts"), "–")


def decode_cells(rows: list[dict]) -> list[dict]:
    """Decode rows with their ``prompt`` kind, a cell's key: a newer cached
    file must not fill a fresh comparison's cell. A file that does not say
    ("–") gives way, as any older file does, to a newer one that says, for the
    same device, context, draft, batch and mode; its plain row stays while
    a speculative row of its file does."""
    rows = [{**r, "prompt": _prompt_kind(r)} for r in rows]

    def cell(r):
        return r["device"], r["context"], r["draft"], r["batch"], r["mode"]

    said: dict = {}
    for r in rows:
        if r["prompt"] != "–":
            said[cell(r)] = max(said.get(cell(r), ("", "")), file_age(r["file"]))

    def superseded(r) -> bool:
        return r["prompt"] == "–" and file_age(r["file"]) <= said.get(cell(r), ("", ""))

    # Plain rows (no draft) stay with the speculative rows of their file
    # still shown: the ratios divide only within one file.
    shown = {(r["file"], r["context"], r["batch"]) for r in rows
             if r["draft"] is not None and r["prompt"] == "–" and not superseded(r)}
    return [r for r in rows if not superseded(r)
            or (r["draft"] is None and (r["file"], r["context"], r["batch"]) in shown)]


# A serve_rate line's key: runs of another length are another measurement.
RATE_KEYS = ["workload", "context", "load", "queue", "requests"]


def render(rows: list[dict], link_base: Path | None = None) -> str:
    """The headline tables (markdown), links relative to ``link_base``."""
    speed = [r for r in rows if r["synthetic_acceptance"] and not r.get("variant")]
    speed = [*decode_cells([r for r in speed if r["bench"] == "decode"]),
             *(r for r in speed if r["bench"] != "decode")]
    parts = []
    for bench, label, x, key_cols, what, metric in (
        ("decode", "decode", "batch", ["context", "prompt"],
         "decode tok/s after the first token", "tok_s"),
        ("decode", "end to end", "batch", ["context", "prompt"], "end-to-end tok/s "
         "(all output tokens over the whole `generate` call: each run's prefill "
         "and first token included)", "e2e_tok_s"),
        ("serve", "serve", "concurrency", ["workload", "context"], "decode-phase tok/s "
         "(tokens after each request's first, over that time)", "tok_s"),
        ("serve", "serve", "concurrency", ["workload", "context"], "output tok/s",
         "output_tok_s"),
        # Issue #45: at a request rate the latencies are what operators size
        # by (lower is better, so are the ratios).
        ("serve_rate", "serve at a request rate", "request_rate", RATE_KEYS,
         "TPOT p50 ms (lower is better; Poisson arrivals at the rate, req/s; "
         "queue: whether the runs' later requests waited over "
         f"{QUEUE_GROWTH:g} times as long for their first token as the earlier "
         "ones, past the server's capacity; requests: requests a run)",
         "tpot_p50_ms"),
        ("serve_rate", "serve at a request rate", "request_rate", RATE_KEYS,
         "TTFT p50 ms (lower is better)", "ttft_p50_ms"),
    ):
        mine = [r for r in speed if r["bench"] == bench and r.get(metric)
                # End to end holds a prefill only where the prompts were fresh.
                and not (metric == "e2e_tok_s" and r["prompt"] == "cached")]
        if not mine:
            continue
        acceptance = sorted({r["synthetic_acceptance"] for r in mine})
        caption = (f"**{label}**: {what}, median (min–max) over the runs of the "
                   f"newest result file per cell (linked){_busy_note(mine)}; "
                   f"synthetic acceptance length {', '.join(map(str, acceptance))}. "
                   "Generated by `python -m benchmarks.summarize` from "
                   "`summary.json`.")
        # A table per device: the device as a column repeated the widest
        # cell on every line, and each table has only its device's modes.
        tables = [_table([r for r in mine if r["device"] == d], key_cols, x,
                         link_base, f"*{d}*", metric)
                  for d in sorted({r["device"] for r in mine})]
        parts.append("\n\n".join([caption, *tables]))
    return "\n\n".join(parts) + "\n"


def replace_region(text: str, table: str, name: str = "file") -> str:
    """``text`` with the part between the markers replaced by ``table``."""
    if START not in text or END not in text:
        raise ValueError(f"{name} has no {START} ... {END} region: add the two "
                         "markers where the headline tables go")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}{END}{tail}"


def rendered(path: Path, rows: list[dict]) -> str:
    path = Path(path)
    return replace_region(path.read_text(), render(rows, path.resolve().parent),
                          str(path))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", nargs="*", type=Path, default=[], metavar="MD",
                   help="also rewrite the marked region of these files")
    p.add_argument("--check", nargs="*", type=Path, metavar="MD",
                   help="write nothing; fail if summary.json or these files' "
                   "regions differ from a fresh generation")
    args = p.parse_args(argv)
    rows = summarize()
    if args.check is not None:
        stale = [str(SUMMARY)] if SUMMARY.read_text() != dumps(rows) else []
        stale += [str(f) for f in args.check if rendered(f, rows) != f.read_text()]
        if stale:
            print("out of date (run python -m benchmarks.summarize --write ...): "  # noqa: T201
                  + ", ".join(stale), file=sys.stderr)
            return 1
        return 0
    SUMMARY.write_text(dumps(rows))
    for f in args.write:
        f.write_text(rendered(f, rows))
    print(f"{SUMMARY}: {len(rows)} rows")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
