"""What share of a text's tokens a draft vocabulary cut keeps (``draft_vocab``).

    python -m benchmarks.longinput.vocab_coverage --tokenizer DIR [DIR ...] \
        --cuts 8192 16384 32768 --out R.json

A draft restricted to the first N token ids (``draft_vocab: N``) can never
propose a token past the cut: where the target writes one, that draft is
rejected. The share of the evaluation's documents (GovReport and PG-19,
``benchmarks/prompts.py``) tokenized to ids below N bounds what the cut can
keep of a draft's acceptance on such text; real weights tell the rest
(``eval_longinput --spec-extend '{"draft_vocab": N}'``). CPU only, no model.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks import prompts as text_data
from benchmarks.harness.meta import run_metadata


def coverage(ids: np.ndarray, cuts: list[int]) -> dict[int, float]:
    """cut -> share of ``ids`` below it."""
    return {cut: float((ids < cut).mean()) for cut in cuts}


def dataset_ids(tokenizer, dataset: str) -> np.ndarray:
    docs = text_data.load_texts(dataset)
    encoded = tokenizer(list(docs), add_special_tokens=False)["input_ids"]
    return np.concatenate([np.asarray(ids, dtype=np.int64) for ids in encoded])


def markdown(result: dict) -> str:
    cuts = result["cuts"]
    lines = ["Share of the documents' tokens whose id is below the cut "
             "(`benchmarks/longinput/vocab_coverage.py`).", "",
             "| tokenizer | vocabulary | dataset | tokens | "
             + " | ".join(f"< {c}" for c in cuts) + " |",
             "|---|---|---|---|" + "---|" * len(cuts)]
    for r in result["rows"]:
        lines.append(f"| {r['tokenizer']} | {r['vocab_size']} | {r['dataset']} | "
                     f"{r['tokens']} | "
                     + " | ".join(f"{100 * r['coverage'][str(c)]:.1f}%" for c in cuts)
                     + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", nargs="+", required=True)
    parser.add_argument("--cuts", nargs="+", type=int, default=[8192, 16384, 32768])
    parser.add_argument("--datasets", nargs="+", choices=text_data.DATASETS,
                        default=list(text_data.DATASETS))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rows = []
    for path in args.tokenizer:
        tokenizer = AutoTokenizer.from_pretrained(path)
        for dataset in args.datasets:
            ids = dataset_ids(tokenizer, dataset)
            rows.append({"tokenizer": Path(path).name, "vocab_size": len(tokenizer),
                         "dataset": dataset, "tokens": int(ids.size),
                         "coverage": {str(c): v for c, v in coverage(ids, args.cuts).items()}})
    result = {"meta": run_metadata(args), "cuts": args.cuts, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
