"""Plain decoding's answers beside their prompts, for the offline tools
(``lookup_replay``, ``forecast``, ``rules``): each reads a grid's cases and
one ``run.py`` result file of plain decoding, and writes one JSON file."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.realpair import tasks


def load(cases: str | Path, outputs: str | Path) -> tuple[dict, dict, list[dict]]:
    """(the cases' header, prompt ids by case id, the batch-1 records of
    ``outputs`` whose prompts the cases hold). ValueError where ``outputs``
    answered other cases (their ``cases_sha256`` differ)."""
    header, loaded = tasks.load_cases(cases)
    result = json.loads(Path(outputs).read_text())
    if result["meta"].get("cases_sha256") != header["sha256"]:
        raise ValueError(f"{outputs} answered other cases than {cases} "
                         "(their cases_sha256 differ)")
    prompts = {c.id: c.prompt_ids for c in loaded}
    records = [r for r in result["records"] if r["batch"] == 1 and r["id"] in prompts]
    return header, prompts, records


def write(path: Path, result: dict) -> None:
    """``result`` to ``path`` (its folder made), and its rows, one a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    for row in result.get("rows", []):
        print(json.dumps(row))  # noqa: T201
