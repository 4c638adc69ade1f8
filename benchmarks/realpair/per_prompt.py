"""Accepted length per prompt of a few ``run.py`` result files, as markdown.

Probes run a handful of prompts (the CPU's real-pair probes: two 16K prompts
a mode, ~20 minutes each), where a cell's sum hides which prompt moved. A
row per file: each prompt's accepted length (1 + accepted / drafts), all of
them together, the ratio to the first file's (the reference), and how many
outputs equal a plain run's (``--plain``, a ``run.py`` file of the same
prompts at the same batch size; any host: greedy bf16 outputs compared
token for token, the first difference shown). Batch-1 records only: a
batch's counts are its call's, not a prompt's. ``--cell group:context``
keeps one cell's prompts (a grid's file holds several).

    python -m benchmarks.realpair.per_prompt REF.json OTHER.json ... \\
        [--plain PLAIN.json] [--cell copy:16384]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.realpair.summarize import first_difference


def acceptance(records: list[dict]) -> float:
    """1 + accepted / drafts over ``records`` (1.0 where none drafted)."""
    drafts = sum(r["spec"]["drafts"] for r in records)
    accepted = sum(r["spec"]["accepted_tokens"] for r in records)
    return 1.0 + accepted / drafts if drafts else 1.0


def _prompts(result: dict, cell: str | None) -> dict[str, dict]:
    """``result``'s batch-1 records by id, of ``cell`` (group:context) alone
    where given."""
    return {r["id"]: r for r in result["records"] if r["batch"] == 1
            and (cell is None or f"{r['group']}:{r['context']}" == cell)}


def table(files: list[Path], plain: Path | None = None, cell: str | None = None) -> str:
    """The markdown table of ``files`` (the first the reference)."""
    results = [json.loads(f.read_text()) for f in files]
    ids = list(_prompts(results[0], cell))
    if not ids:
        where = f" of {cell}" if cell else ""
        raise SystemExit(f"{files[0]}: no batch-1 record{where}")
    base = None
    if plain is not None:
        base = {(r["id"], r["batch"]): r["output_ids"]
                for r in json.loads(plain.read_text())["records"]}
    head = ["mode", "file", *ids, "all", "× first"]
    if base is not None:
        head.append("= plain")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first = None
    for path, result in zip(files, results, strict=True):
        records = _prompts(result, cell)
        missing = [i for i in ids if i not in records]
        if missing:
            raise SystemExit(f"{path}: no record of {', '.join(missing)}: compare "
                             "files of the same prompts")
        rows = [records[i] for i in ids]
        both = acceptance(rows)
        first = both if first is None else first
        cells = [result["mode"], path.name, *(f"{acceptance([r]):.3f}" for r in rows),
                 f"{both:.3f}", f"{both / first:.2f}"]
        if base is not None:
            diffs = [first_difference(r["output_ids"], base[(r["id"], r["batch"])])
                     for r in rows]
            equal = sum(d is None for d in diffs)
            shown = ", ".join(f"{r['id']} at {d}" for r, d in zip(rows, diffs,
                                                                 strict=True)
                              if d is not None)
            cells.append(f"{equal}/{len(rows)}" + (f" ({shown})" if shown else ""))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--plain", type=Path)
    ap.add_argument("--cell", help="group:context, e.g. copy:16384 (default: all)")
    args = ap.parse_args(argv)
    print(table(args.files, args.plain, args.cell))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
