"""The copy tasks' summary (issue #46; the tasks: ``copytasks``): results
files turned into the issue's summary rows, accepted length (tokens per target
forward) over the spans of the cases that count, with intervals, and
per-prompt pairs between modes (``eval_longinput copy-summary``)."""

from __future__ import annotations

from benchmarks.harness.meta import device
from benchmarks.longinput import acceptance, engine, report
from benchmarks.longinput.copytasks import TASKS

# Mode names in the summary (issue #46); a cmr mode ranking with another layer
# than the final one gets "_l<layer>" (cmr_l21).
SUMMARY_MODES = {"none": "plain", "draft_model": "full_kv", "self_full": "full_kv",
                 "streaming": "window", "self_streaming": "window", "cmr": "cmr",
                 "self_cmr": "cmr", "streaming_compact": "window_compact",
                 "cmr_compact": "cmr_compact", "ngram": "ngram"}


def summary_mode(row: dict) -> str:
    name = SUMMARY_MODES[row["mode"]]
    layer = report.engine_score_layer(row)
    if engine.policy(row["mode"]) == "cmr" and layer not in (None, -1):
        name += f"_l{layer}"
    return name


def drafter(row: dict, meta: dict) -> str:
    """What drafted a row: ``self`` (the target, through the plugin's
    self_draft or a draft model that is the target's checkpoint), the draft
    model's path, ``prompt lookup`` (ngram) or ``-`` (plain decoding)."""
    if row["mode"] == "none":
        return "-"
    if row["mode"] == "ngram":
        return "prompt lookup"
    models = meta.get("models") or {}
    target = (models.get("target") or {}).get("path")
    draft = (models.get("draft") or {}).get("path")
    return "self" if row["mode"].startswith("self_") or draft == target else draft


def forward_units(row: dict, kept: dict[str, bool]) -> dict[str, dict]:
    """Per prompt hash ``kept``: its output tokens after the first
    and the target forwards that wrote them, as the ``drafts`` /
    ``accepted_tokens`` of ``acceptance``'s intervals and pairs (so
    ``1 + accepted / drafts`` is tokens per target forward)."""
    units = {}
    for h, n, f in zip(row["prompt_hashes"], row["output_lens"], row["forwards"],
                       strict=True):
        if kept.get(h, False):
            units[h] = {"drafts": f, "accepted_tokens": n - 1 - f}
    return units


def summary(results: dict[str, dict]) -> dict:
    """Summary rows ``{task, dataset, context, mode, draft, working_set,
    accepted_length, ci, n_prompts, n_run, n_cases, n_right, mismatches,
    device}`` from results files (path -> contents): accepted length is
    tokens per target forward over the quoted spans of the cases that count
    (``n_prompts``; ``score``'s ``kept``), with a 95% bootstrap interval over
    those prompts; ``n_cases`` cases were built, the target answered
    ``n_right`` of them whole; ``mismatches``: greedy outputs that differ
    from plain decoding's over every prompt the row ran (``n_run``). A run
    repeated in a later file replaces the earlier one. ``paired``: each mode
    against the window (same working set) and against ngram on the same
    prompts, as ``eval_longinput paired`` pairs them."""
    tagged = []
    for result in results.values():
        meta = result.get("meta") or {}
        tagged.append({"meta": meta, "rows": [
            {**r, "_device": device(meta), "_draft": drafter(r, meta)}
            for r in result["rows"] if r["task"] in TASKS]})
    rows = report.merge(tagged)["rows"] if tagged else []

    def cell(r):
        return (r["task"], r["dataset"], r["length"])

    # Whether each case counts, and was answered whole: plain decoding's
    # verdicts where it ran (it ran every case, and whole answers).
    verdicts: dict[tuple, dict[str, tuple[bool, bool]]] = {}
    for r in sorted(rows, key=lambda r: r["mode"] == "none"):
        verdicts.setdefault(cell(r), {}).update(
            zip(r["prompt_hashes"], zip(r["kept"], r["correct"], strict=True),
                strict=True))
    out, units = [], {}
    for r in sorted(rows, key=lambda r: (*cell(r), report.MODE_ORDER[r["mode"]],
                                         r.get("working_set") or 0,
                                         report.engine_score_layer(r) or 0)):
        found = verdicts[cell(r)]
        mine = forward_units(r, {h: kept for h, (kept, _) in found.items()})
        forwards = sum(u["drafts"] for u in mine.values())
        accepted = sum(u["accepted_tokens"] for u in mine.values())
        row = {
            "task": r["task"], "dataset": r["dataset"], "context": r["length"],
            "mode": summary_mode(r), "draft": r["_draft"],
            "working_set": r.get("working_set"),
            "accepted_length": 1.0 + accepted / forwards if forwards else None,
            "ci": acceptance.accepted_length_interval(list(mine.values())),
            "n_prompts": len(mine), "n_run": len(r["prompt_hashes"]),
            "n_cases": len(found), "n_right": sum(whole for _, whole in found.values()),
            "mismatches": r.get("mismatches"), "device": r["_device"],
        }
        out.append(row)
        units[id(row)] = mine
    return {"files": list(results), "rows": out, "paired": _pairs(out, units)}


def _pairs(rows: list[dict], units: dict[int, dict]) -> list[dict]:
    pairs = []
    for r in rows:
        if r["mode"] in ("plain", "window"):
            continue
        for base in rows:
            same = ((base["task"], base["dataset"], base["context"], base["device"])
                    == (r["task"], r["dataset"], r["context"], r["device"]))
            if not same or base is r or base["mode"] not in ("window", "ngram"):
                continue
            if base["mode"] == "window" and (
                    r["draft"] not in (base["draft"], "prompt lookup")
                    or r["working_set"] not in (None, base["working_set"])):
                continue
            if base["mode"] == "ngram" and r["mode"] == "ngram":
                continue
            mine, theirs = units[id(r)], units[id(base)]
            both = [h for h in mine if h in theirs]
            found = acceptance.paired_ratio([mine[h] for h in both],
                                            [theirs[h] for h in both])
            pairs.append({
                "task": r["task"], "dataset": r["dataset"], "context": r["context"],
                "mode": r["mode"], "draft": r["draft"], "working_set": r["working_set"],
                "baseline": base["mode"], "baseline_working_set": base["working_set"],
                "accepted_length": r["accepted_length"],
                "baseline_accepted_length": base["accepted_length"],
                **(found or {"ratio": None, "interval": None, "better": None,
                             "prompts": len(both)}),
            })
    return pairs


def summary_markdown(summary: dict) -> str:
    def fmt(x, digits=2):
        if x is None:
            return "–"
        if isinstance(x, float):
            return f"{x:.{digits}f}"
        if isinstance(x, list):
            return "–".join(fmt(v, digits) for v in x)
        return str(x)

    lines = [
        "Copy tasks (issue #46). Accepted length: tokens per target forward "
        "(1 + accepted / drafts, every forward counted, also those that drafted "
        "nothing) over the span of each answer that quotes the expected text, in "
        "the cases where that span is long enough (kept), 95% bootstrap interval "
        "over those prompts; right: whole answers right; mismatches: greedy "
        "outputs that differ from plain decoding over every prompt run. From: "
        f"{', '.join(summary['files'])}.",
        "",
        "| task | dataset | context | draft | mode | working set | accepted length "
        "| 95% interval | prompts kept (right / cases) | mismatches | device |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        lines.append(
            f"| {r['task']} | {r['dataset']} | {r['context']} | {r['draft']} "
            f"| {r['mode']} | {fmt(r['working_set'])} | {fmt(r['accepted_length'])} "
            f"| {fmt(r['ci'])} | {r['n_prompts']} ({r['n_right']} / {r['n_cases']}) "
            f"| {fmt(r['mismatches'])} | {r['device']} |")
    lines += [
        "", "Paired on the same prompts kept: ratio of accepted lengths, "
        "95% bootstrap interval drawing prompts for both, prompts that drafted better.",
        "",
        "| task | dataset | context | draft | mode | working set | against "
        "| ratio | 95% interval | better |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in summary["paired"]:
        lines.append(
            f"| {p['task']} | {p['dataset']} | {p['context']} | {p['draft']} "
            f"| {p['mode']} | {fmt(p['working_set'])} | {p['baseline']} "
            f"({fmt(p['baseline_working_set'])}) | {fmt(p['ratio'], 3)} "
            f"| {fmt(p['interval'], 3)} | {fmt(p['better'])} of {p['prompts']} |")
    return "\n".join(lines) + "\n"
