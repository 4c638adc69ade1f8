"""Deterministic long prompts of exact token lengths, for benchmarks and tests.

Text comes from the long-context JSONL files under ``../shared/data`` (relative
to the repository root; override with ``$SPECEXTEND_DATA_DIR``):
``pg19/pg19_*.jsonl`` (books) and ``govreport/govreport_*.jsonl`` (reports).
Each row has a ``text`` field that starts with a summarization instruction
header, which is stripped so that different prompts do not share a prefix.

Prompts are returned as lists of token ids (tokenized without special tokens
and truncated), so their lengths are exact.  Feed them to vLLM as
``{"prompt_token_ids": ids}`` (see :func:`as_token_prompts`).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DATASETS = ("pg19", "govreport")

_HEADER_END = "### Text:"


def data_dir() -> Path:
    env = os.environ.get("SPECEXTEND_DATA_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def _size_key(path: Path) -> int:
    # pg19_16K.jsonl -> 16384, govreport_512.jsonl -> 512
    tag = path.stem.rsplit("_", 1)[-1]
    mult = 1024 if tag.upper().endswith("K") else 1
    try:
        return int(tag.rstrip("kK")) * mult
    except ValueError:
        return 0


def _strip_header(text: str) -> str:
    i = text.find(_HEADER_END)
    if 0 <= i < 200:
        text = text[i + len(_HEADER_END):]
    return text.strip()


def doc_key(text: str) -> str:
    """What tells documents apart: a document repeated (prefix-truncated) in
    several size buckets starts the same."""
    return text[:300]


def rows(dataset: str):
    """``(text, row)`` of every row of ``dataset``'s files, longest file first,
    ``text`` the row's document with its header stripped."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; choose from {DATASETS}")
    files = sorted((data_dir() / dataset).glob(f"{dataset}_*.jsonl"),
                   key=_size_key, reverse=True)
    if not files:
        raise FileNotFoundError(f"no {dataset}_*.jsonl under {data_dir() / dataset}")
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if line:
                    row = json.loads(line)
                    yield _strip_header(row["text"]), row


@functools.cache
def load_texts(dataset: str = "pg19") -> tuple[str, ...]:
    """All documents of ``dataset``, longest file first, header stripped.

    Within each file the row order is kept; a document that appears (as a
    prefix-truncated copy) in several size buckets is kept once, longest copy.
    """
    docs: list[str] = []
    seen: set[str] = set()
    for text, _ in rows(dataset):
        key = doc_key(text)
        if text and key not in seen:
            seen.add(key)
            docs.append(text)
    return tuple(docs)


def _tokenizer_key(tokenizer) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or id(tokenizer))


_TOKEN_CACHE: dict[tuple[str, str, int], list[int]] = {}


def _doc_tokens(tokenizer, dataset: str, index: int) -> list[int]:
    key = (_tokenizer_key(tokenizer), dataset, index)
    ids = _TOKEN_CACHE.get(key)
    if ids is None:
        text = load_texts(dataset)[index]
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        _TOKEN_CACHE[key] = ids
    return ids


def _load_tokenizer(tokenizer):
    if isinstance(tokenizer, (str, os.PathLike)):
        return _cached_tokenizer(str(tokenizer))
    return tokenizer


@functools.lru_cache(maxsize=8)
def _cached_tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def long_prompts(
    tokenizer,
    lengths: int | Sequence[int],
    num_prompts: int | None = None,
    *,
    dataset: str = "pg19",
    start: int = 0,
) -> list[list[int]]:
    """Deterministic prompts (token-id lists) of exact lengths.

    ``tokenizer``: a HF tokenizer or a model/tokenizer directory.
    ``lengths``: one length per prompt, or a single int together with
    ``num_prompts`` (default 1).  Prompt ``i`` is taken from document
    ``start + i`` (cycling through the dataset); if that document is shorter
    than the requested length, the following documents are appended.  When the
    dataset wraps around, later prompts start at a different offset, so
    prompts never repeat within a call.
    """
    tok = _load_tokenizer(tokenizer)
    if isinstance(lengths, int):
        lengths = [lengths] * (1 if num_prompts is None else num_prompts)
    elif num_prompts is not None and num_prompts != len(lengths):
        raise ValueError("num_prompts does not match len(lengths)")
    n_docs = len(load_texts(dataset))
    prompts = []
    for i, n in enumerate(lengths):
        if n <= 0:
            raise ValueError(f"prompt length must be positive, got {n}")
        k = start + i
        doc, cycle = k % n_docs, k // n_docs
        offset = cycle * 997  # distinct starting points after wrap-around
        ids: list[int] = []
        j = 0
        while len(ids) < offset + n:
            if j >= n_docs:
                raise ValueError(f"dataset {dataset!r} too small for {n} tokens")
            ids.extend(_doc_tokens(tok, dataset, (doc + j) % n_docs))
            j += 1
        prompts.append(ids[offset:offset + n])
    return prompts


def as_token_prompts(prompts: Sequence[Sequence[int]]) -> list[dict]:
    """Wrap token-id lists as vLLM ``TokensPrompt`` dicts."""
    return [{"prompt_token_ids": list(p)} for p in prompts]
