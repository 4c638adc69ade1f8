"""``benchmarks/results/realpair/summary.json`` from the per-prompt result files.

A row per (mode, k, task, context, batch) of every run folder under
``benchmarks/results/realpair/`` (each folder: one host, one session, a file
per mode written by ``run.py``):

* ``prompts``; ``right``: answers that ``tasks.check`` accepts (None where
  the task has no check);
* ``acc_len``: 1 + accepted / drafts over the cell (vLLM's counters; prompt
  lookup counts only the steps where it proposed, and a request's last step
  counts drafts accepted past the answer's end: ``rules.py`` scores steps
  exactly); 1.0 for plain;
* ``e2e_tok_s``: output tokens over the ``generate`` calls' seconds, prefill
  included; ``e2e_min/median/max``: per call (a prompt at batch 1, eight at
  batch 8);
* ``decode_tok_s``: tokens after each request's first over the seconds from
  its first token to its last (batch 8: a batch's tokens after their first
  over the span from its first first-token to its last token);
* ``ttft_s``: median first-token latency; ``gpu_busy``: mean NVML busy share
  over the calls;
* ``equal_to_plain``: prompts whose greedy output equals plain's (same batch
  size; None without a plain run in the folder); ``differs``: the first
  differing token index of each other prompt;
* ``device``, ``file``.

    python -m benchmarks.realpair.summarize            # writes summary.json
    python -m benchmarks.realpair.summarize --table    # and prints the markdown
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from benchmarks.harness.meta import REPO_ROOT, device
from vllm_specextend.config import AUTO_LOOKUP_DRAFTED, AUTO_LOOKUP_MIN_K

RESULTS = REPO_ROOT / "benchmarks" / "results" / "realpair"


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (the shorter's
    length where one is a prefix of the other); None where equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _calls(records: list[dict]) -> list[list[dict]]:
    """The records grouped by ``generate`` call (one at batch 1)."""
    calls: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        calls[r["call"]].append(r)
    return list(calls.values())


def cell_row(records: list[dict], plain: dict[tuple, list[int]] | None) -> dict:
    """The summary row of one cell's records (one mode, k, task, context, batch)."""
    calls = _calls(records)
    tokens = sum(r["output_tokens"] for r in records)
    e2e = sum(c[0]["e2e_s"] for c in calls)
    per_call = sorted(sum(r["output_tokens"] for r in c) / c[0]["e2e_s"] for c in calls)
    decode_tokens = sum(max(0, r["output_tokens"] - 1) for r in records)
    decode_s = 0.0
    for c in calls:
        if any(r["first_ts"] is None for r in c):
            decode_s = None
            break
        decode_s += max(r["last_ts"] for r in c) - min(r["first_ts"] for r in c) \
            if len(c) > 1 else c[0]["decode_s"]
    specs = [c[0]["spec"] for c in calls if c[0].get("spec")]
    drafts = sum(s["drafts"] for s in specs)
    acc_len = 1.0 if not specs else (1 + sum(s["accepted_tokens"] for s in specs) / drafts
                                     if drafts else None)
    checks = [r["right"] for r in records if r["right"] is not None]
    busy = [c[0]["gpu_busy"] for c in calls if c[0].get("gpu_busy") is not None]
    equal = differs = None
    if plain is not None:
        equal, differs = 0, {}
        for r in records:
            base = plain.get((r["id"], r["batch"]))
            at = None if base is None else first_difference(r["output_ids"], base)
            if base is not None and at is None:
                equal += 1
            else:
                differs[r["id"]] = at
    ttfts = [r["ttft_s"] for r in records if r["ttft_s"] is not None]
    return {
        "prompts": len(records),
        "right": len([c for c in checks if c]) if checks else None,
        "acc_len": None if acc_len is None else round(acc_len, 3),
        "e2e_tok_s": round(tokens / e2e, 1),
        "e2e_min": round(per_call[0], 1), "e2e_median": round(statistics.median(per_call), 1),
        "e2e_max": round(per_call[-1], 1),
        "decode_tok_s": round(decode_tokens / decode_s, 1) if decode_s else None,
        "ttft_s": round(statistics.median(ttfts), 4) if ttfts else None,
        "gpu_busy": round(sum(busy) / len(busy), 3) if busy else None,
        "output_tokens": tokens,
        "equal_to_plain": equal, "differs": differs or None,
    }


DRAFTED_FROM_ANSWERS = {
    ("20261206T1636Z_h100_carry", "suffix", "copy", 16384, 8):
        "SuffixDecoding drafted from its cached answers to the same 16 prompts, "
        "answered at batch 1 earlier in that engine (accepted length 7.34 against "
        "3.85 at batch 1); run.py forgets them before each cell since",
}
"""Rows measured unfairly, and why: (folder, mode, task, context, batch).
Kept in summary.json with the reason (``note``), left out of the headline's
best of vLLM's own and named below it."""


def folder_rows(folder: Path) -> list[dict]:
    """Rows of one run folder (its ``*.json`` result files)."""
    files = sorted(p for p in folder.glob("*.json") if p.name != "summary.json")
    # run.py's files only: a step profile (profile.py) has no records.
    loaded = [(p, r) for p in files if "records" in (r := json.loads(p.read_text()))]
    plain = None
    for _, result in loaded:
        if result["mode"] == "plain":
            plain = {(r["id"], r["batch"]): r["output_ids"] for r in result["records"]}
    rows = []
    for path, result in loaded:
        cells: dict[tuple, list[dict]] = defaultdict(list)
        for r in result["records"]:
            cells[(r["group"], r["context"], r["batch"])].append(r)
        for (task, context, batch), records in sorted(cells.items()):
            rows.append({"mode": result["mode"], "k": result["k"], "task": task,
                         "context": context, "batch": batch,
                         **cell_row(records, plain),
                         "device": device(result["meta"]),
                         "vllm": result["meta"].get("vllm"),
                         "commit": result["meta"].get("git_commit"),
                         "date_utc": result["meta"].get("date_utc"),
                         "file": f"{RESULTS.relative_to(REPO_ROOT)}/{folder.name}/{path.name}"})
            note = DRAFTED_FROM_ANSWERS.get(
                (folder.name, result["mode"], task, context, batch))
            if note is not None:
                rows[-1]["note"] = note
    return rows


def summary(root: Path = RESULTS) -> list[dict]:
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        rows += folder_rows(folder)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown: a line per row, ratios to plain of the same folder and cell."""
    plain = {(r["file"].rsplit("/", 1)[0], r["task"], r["context"], r["batch"]): r
             for r in rows if r["mode"] == "plain"}
    out = ["| task | context | batch | mode | k | acc_len | e2e tok/s (× plain) | "
           "decode tok/s (× plain) | TTFT s | right | = plain | GPU busy |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["task"], r["context"], r["batch"],
                                         r["file"], r["mode"], r["k"] or 0)):
        base = plain.get((r["file"].rsplit("/", 1)[0], r["task"], r["context"], r["batch"]))

        def ratio(key, r=r, base=base):
            if not base or not r[key] or not base[key]:
                return f"{r[key]}"
            return f"{r[key]} ({r[key] / base[key]:.2f}×)"
        mode = r["mode"] + (" (drafted from cached answers)" if r.get("note") else "")
        out.append(f"| {r['task']} | {r['context']} | {r['batch']} | {mode} | "
                   f"{r['k'] or '-'} | {r['acc_len']} | {ratio('e2e_tok_s')} | "
                   f"{ratio('decode_tok_s')} | {r['ttft_s']} | "
                   f"{r['right']}/{r['prompts']} | {r['equal_to_plain']} | "
                   f"{r['gpu_busy']} |")
    return "\n".join(out)


VLLM_METHODS = ("draft_model", "ngram", "ngram_gpu", "suffix")
CELL_NAMES = {"copy": "copies its input", "other": "explains or summarises"}
START, END = "<!-- realpair:start -->", "<!-- realpair:end -->"
DEFAULTS_RUN = ("spec_extend", 20)
"""The mode and K of a run folder that ran today's defaults: ``spec_extend``
(no keys) at K=20, the K the README's quick start passes, where
``lookup_tokens: "auto"`` looks up 17 of the 20."""

DEFAULTS_AS: dict[str, tuple[str, int] | None] = {
    "20261206T0403Z_h100_defaults_vs_plain": None,
    "20261206T0542Z_h100_grid": None,
    "20261206T0828Z_h100_levers": None,
    "20261206T0843Z_h100_batch8": None,
    "20261206T1131Z_h100_lookup": None,
    "20261206T1423Z_h100_k12": None,
    "20261206T1431Z_h100_batch8_lookup": None,
    "20261206T1636Z_h100_carry": None,
    "20261206T2234Z_h100_pieces": None,
    "20261207T0050Z_h100_budget": None,
    "20261207T0602Z_h200_fill": None,
    "20261207T0834Z_h100_fill2": None,
    "20261207T0853Z_h100_fill2_repeat": None,
    "20261207T1341Z_h100_k4": None,
    "20261207T1541Z_h100_k4pass": None,
}
"""Run folders measured before today's defaults, and the mode and K that ran
them there (None: none did). On 2026-12-06 ``draft_prompt_pool`` became the
full pass (null), ``top_k`` became 64, then ``lookup_tokens`` became
``"auto"`` with K=8 in the quick start (1131Z ran that as
``spec_extend_lookup`` K=8), then the quick start's K became 12 (1423Z:
K=12 against K=8 in one session), then ``draft_prefill_window`` became
``"auto"`` (4,096, windowed inside a chunk: 2234Z ran it as
``spec_extend_pw4k`` K=12; its ``spec_extend`` is the full pass before),
then a step schedules plain decoding's token budget (2026-12-07,
``scheduling.plain_step_budget``: every folder before ran vLLM's, 15,360 a
step; 0050Z ran that as ``spec_extend_step15k``), then ``draft_prompt_pool``
and ``draft_pool_fill`` became ``"auto"`` (2026-12-07: the pool, grown by 8
chunks a refresh; 0834Z ran that as ``spec_extend_fill8`` K=12, and its
``spec_extend`` is the windowed full pass before; 0602Z's ``spec_extend_fill8``
ran before the fill's stream sync was mended, so it stands for no default),
then the quick start's K became 20 (2124Z: K=20 against K=12 and 16 in one
session; no folder before ran the defaults at K=20). Before 1131Z every
plugin mode ran K=4 without the lookup. Folders not named here ran today's
defaults as ``DEFAULTS_RUN``."""


def defaults_run(folder: str) -> tuple[str, int] | None:
    """The mode and K of run folder ``folder`` (its name) that ran today's
    defaults, or None."""
    return DEFAULTS_AS.get(folder, DEFAULTS_RUN)


def _has_vllm_method(by: dict) -> bool:
    """Whether a folder's cell (its rows by mode and k) ran one of vLLM's
    own methods fairly (a row with a ``note`` was measured unfairly)."""
    return any(name in VLLM_METHODS and not r.get("note") for (name, _), r in by.items())


def headline(rows: list[dict]) -> str:
    """The README's real-weight table: per cell, from the newest run folder
    that ran the plugin's defaults there (``DEFAULTS_AS``) beside plain and
    one of vLLM's own methods (the newest without one only where none ran
    one beside them), the
    defaults and the fastest of vLLM's own methods of that folder (each at
    its better k), end to end as a multiple of plain decoding (higher is
    better), with accepted lengths and the GPU busy share; each cell linked
    to its file. A cell no folder ran at today's defaults is named below the
    table with its newest figure and the mode that gave it."""
    by_folder: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_folder[r["file"].rsplit("/", 1)[0]].append(r)
    chosen: dict[tuple, tuple[dict, dict, dict]] = {}  # cell -> its rows, plain, plugin
    stale: dict[tuple, tuple[dict, dict]] = {}  # cell -> plain, newest other run
    drafts: dict[tuple, dict] = {}  # cell -> newest draft_model row (acceptance)
    for folder in sorted(by_folder):  # oldest first: newer folders overwrite
        run = defaults_run(folder.rsplit("/", 1)[-1])
        cells = defaultdict(dict)
        for r in by_folder[folder]:
            cells[(r["task"], r["context"], r["batch"])][(r["mode"], r["k"])] = r
        for cell, by in cells.items():
            if ("draft_model", 4) in by:
                drafts[cell] = by[("draft_model", 4)]
            plain = by.get(("plain", None))
            if plain is None:
                continue
            if run is not None and run in by and (
                    cell not in chosen or not _has_vllm_method(chosen[cell][0])
                    or _has_vllm_method(by)):
                chosen[cell] = (by, plain, by[run])
            for name in ("spec_extend", "spec_extend_full_pass"):
                if (name, 4) in by:
                    stale[cell] = (plain, by[(name, 4)])
                    break
    first = (next(iter(chosen.values()))[1] if chosen
             else next(iter(stale.values()))[0])
    device, vllm, prompts = first["device"], first["vllm"], first["prompts"]
    # The K the plugin's cells ran: the quick start's, or each cell's where a
    # DEFAULTS_AS entry ran another.
    ks = {plugin["k"] for _, _, plugin in chosen.values()} or {DEFAULTS_RUN[1]}
    k = ks.pop() if len(ks) == 1 else None
    looked_up = ("" if k is None or k < AUTO_LOOKUP_MIN_K else
                 f" (`lookup_tokens` \"auto\": the draft model drafts "
                 f"{AUTO_LOOKUP_DRAFTED}, the request's own context gives "
                 f"{k - AUTO_LOOKUP_DRAFTED})")
    out = [f"Real weights: Qwen2.5-Coder-1.5B-Instruct drafted by its 0.5B, greedy, "
           f"fresh prompts, {prompts} a cell, end to end "
           f"(prefill included) as a multiple of plain decoding: higher is better "
           f"({device}, vLLM {vllm}). `--spec-extend`: today's defaults with "
           + (f"`--num-speculative-tokens {k}`{looked_up}" if k is not None
              else "the K each cell names")
           + "; vLLM's own methods run in the cell's session, each at the best "
           "K that session ran of 4 and 8 (named); each cell's "
           "figures come from one session.",
           "",
           "| the answer | prompt | batch | `--spec-extend` | best of vLLM's own (same session) | "
           f"accepted length: plugin{'' if k is None else f' K={k}'} / `draft_model` K=4 |",
           "|---|---|---|---|---|---|"]
    refs: dict[str, str] = {}

    def x(r, plain, label=""):
        busy = "" if r["gpu_busy"] is None else f" · GPU busy {r['gpu_busy']:.2f}"
        ref = refs.setdefault(r["file"], f"r{len(refs) + 1}")
        return f"[{r['e2e_tok_s'] / plain['e2e_tok_s']:.2f}×][{ref}]{label}{busy}"

    left_out: list[tuple[tuple, dict, dict]] = []  # rows measured unfairly
    for cell in sorted(chosen):
        task, context, batch = cell
        by, plain, plugin = chosen[cell]
        measured = [r for (name, _), r in by.items() if name in VLLM_METHODS]
        vllm_rows = [r for r in measured if not r.get("note")]
        left_out += [(cell, r, plain) for r in measured if r.get("note")]
        best = max(vllm_rows, key=lambda r: r["e2e_tok_s"], default=None)
        # Accepted length does not hang on the session's speed: draft_model's
        # newest, from another session where this one did not run it.
        draft = drafts.get(cell)
        own_k = "" if k is not None else f" K={plugin['k']}"
        out.append(
            f"| {CELL_NAMES.get(task, task)} | {context // 1024}K | {batch} | "
            f"{x(plugin, plain, own_k)} | "
            + (f"{x(best, plain)} `{best['mode']}` K={best['k']}" if best
               else "left out (below)" if measured else "not run")
            + f" | {plugin['acc_len']:.2f} / "
            + (f"[{draft['acc_len']:.2f}][{refs.setdefault(draft['file'], f'r{len(refs) + 1}')}] |"
               if draft else "not run |"))
    for (task, context, batch), r, plain in left_out:
        out.append("")
        out.append(f"Left out of the best of vLLM's own at {context // 1024}K, batch "
                   f"{batch}: `{r['mode']}` K={r['k']} {x(r, plain)}: {r['note']}.")
    missing = sorted(set(stale) - set(chosen))
    if missing:
        out.append("")
        out.append("Not yet measured at today's defaults: " + "; ".join(
            f"{CELL_NAMES.get(t, t)} at {c // 1024}K, batch {b} "
            f"(`{old['mode']}` K={old['k']} before the change: {x(old, plain)})"
            for (t, c, b), (plain, old) in ((cell, stale[cell]) for cell in missing))
            + ".")
    # Files as reference links below the table: its lines stay short.
    out += [""] + [f"[{ref}]: {file}" for file, ref in refs.items()]
    return "\n".join(out)


def write(path: Path, text: str) -> None:
    """``text`` between ``START`` and ``END`` in ``path``."""
    doc = path.read_text()
    head, _, rest = doc.partition(START)
    _, found, tail = rest.partition(END)
    if not found:
        raise SystemExit(f"{path} has no {START} ... {END} block")
    path.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=RESULTS)
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--write", type=Path, nargs="*", default=[],
                    help="files whose realpair block gets the headline (README.md) "
                         "or, for docs/*.md, the whole table")
    args = ap.parse_args(argv)
    rows = summary(args.root)
    (args.root / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    for path in args.write:
        write(path, table(rows) if path.parent.name == "docs" else headline(rows))
    if args.table:
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
