"""The evaluation's summarization prompts, as token ids of exact lengths.

Each prompt is the SpecExtend paper's format (``text`` of its GovReport / PG-19
files): an instruction header, a document truncated to fit, and a
``### Summary:`` tail, without a chat template. The documents come from
``benchmarks/prompts.py`` (``../shared/data``, ``$SPECEXTEND_DATA_DIR``); prompt
``i`` of every length starts with document ``i``.
"""

from __future__ import annotations

from benchmarks import prompts as text_data

SUMMARY_HEAD = (
    "\n\nSummarize the following text into a summary of less than 800 words.\n"
    "### Text:\n\n"
)
SUMMARY_TAIL = "\n\n### Summary:\n\n"

DATASETS = text_data.DATASETS


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def summary_prompts(tokenizer, dataset: str, length: int, num_prompts: int,
                    start: int = 0) -> list[list[int]]:
    """``num_prompts`` prompts of exactly ``length`` tokens."""
    head, tail = encode(tokenizer, SUMMARY_HEAD), encode(tokenizer, SUMMARY_TAIL)
    bodies = text_data.long_prompts(
        tokenizer, length - len(head) - len(tail), num_prompts,
        dataset=dataset, start=start,
    )
    return [head + body + tail for body in bodies]


def haystack(tokenizer, length: int, index: int) -> list[int]:
    """``length`` tokens of PG-19 text from document ``index`` on."""
    return text_data.long_prompts(tokenizer, length, dataset="pg19", start=index)[0]
