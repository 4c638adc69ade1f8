"""Copy tasks: long inputs that the output quotes or edits (issue #46).

Where a summary paraphrases what a streaming window already holds, these
answers repeat text from far back in the prompt, which only the full KV or a
retrieved chunk can show the draft:

* ``quote``: "Repeat verbatim the paragraph of the text above that begins
  with "...". The answer must be that paragraph.
* ``edit``: the same paragraph with a small systematic change: every
  occurrence of one name (a report's or a book's proper noun, a Python docs
  passage's identifier) replaced by a new one. Most of the answer repeats the
  input, but not verbatim.

A prompt is exactly ``length`` tokens: SmolLM2-Instruct's chat turn (its
tokenizer's chat template; a plain ``### Answer:`` without one) around a
``### Text:`` of real text with the copied paragraph starting at ``depth`` of
it (a fraction of the text, as the passkey's depth in ``needle``), then the
task. The answer is primed with the paragraph's opening words (edited for
``edit``): the target continues from there, and the draft must find the rest
far back (SmolLM2-135M does not find the paragraph from the instruction alone:
it repeats the document's start). An answer ends at a blank line (the
paragraph's end). It is right when, whitespace runs collapsed, it is the rest
of the expected paragraph.

What a case measures is its answer's quoted span: the output tokens that
write the expected text, up to the first one that does not (``score``).
SmolLM2-135M quotes a paragraph from 2K tokens back whole only now and then,
but often quotes its first tens of tokens before it paraphrases; over the
span the output repeats the input far back, which is the workload. A case
counts (``kept``) where the span has at least ``min_tokens`` tokens and, for
``edit``, passes the first renamed name (before it, an edit is a quote).

Text (``SOURCES``): GovReport and PG-19 from ``benchmarks.prompts``
(``../shared/data``), and Python's documentation
(``benchmarks.models.pydoc_corpus``). PG-19 and the Python docs come in
paragraphs (blank lines). GovReport's reports are one line each: their
sentences are grouped into paragraphs of about ``REPORT_PARAGRAPH_CHARS``
characters, separated by blank lines, so that "the paragraph" means something
in the prompt. Case ``index`` reads from document ``index`` on, so cases of one
cell use different documents where the source has enough.

Their summary over results files: ``copysummary``.
"""

from __future__ import annotations

import functools
import itertools
import keyword
import re
from collections import Counter
from dataclasses import dataclass

TASKS = ("quote", "edit")
SOURCES = ("govreport", "pg19", "pydoc")
QUOTE = 'Repeat verbatim the paragraph of the text above that begins with "{opening}".'
EDIT = ('Repeat the paragraph of the text above that begins with "{opening}", '
        'with every "{old}" replaced by "{new}".')
TEXT_HEAD = "### Text:\n\n"
TASK_HEAD = "\n\n### Task:\n"
PLAIN_ANSWER = "\n\n### Answer:\n"  # tokenizers without a chat template
SEPARATOR = "\n\n"
REPORT_PARAGRAPH_CHARS = 200
# New names for ``edit``: people for reports and books, identifiers for the
# Python docs; the first one that the prompt does not hold is used.
NAMES = ("Hartwell", "Okafor", "Lindqvist", "Moreau", "Castellanos", "Brannigan")
IDENTIFIERS = ("frobnicate", "quux_count", "widget_map", "blorp_id", "spam_total")
_WORD = r"[A-Za-z_][A-Za-z0-9_]*"


@dataclass(frozen=True)
class CopyCase:
    """One prompt and what its answer must be."""

    task: str
    source: str
    prompt: list[int]
    depth: float  # asked: where the paragraph starts, as a fraction of the text
    text_start: int  # prompt index of the text's first token
    at: int  # the paragraph's first token, counted from the text's start
    text_tokens: int  # tokens of text (the haystack) in the prompt
    paragraph: str  # as the prompt holds it
    paragraph_tokens: int
    opening: str  # the paragraph's first words, quoted by the task
    primed: str  # what the answer starts with (the prompt's last tokens)
    expected: str  # what the target must write after ``primed``
    old: str | None = None  # edit: the name replaced ...
    new: str | None = None  # ... and its replacement


# --------------------------------------------------------------------------- #
# text
# --------------------------------------------------------------------------- #
@functools.cache
def documents(source: str) -> tuple[str, ...]:
    if source == "pydoc":
        from benchmarks.models.pydoc_corpus import python_docs

        return tuple(python_docs())
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose from {SOURCES}")
    from benchmarks import prompts as text_data

    return text_data.load_texts(source)


def paragraphs(source: str, text: str) -> list[str]:
    """A document's paragraphs: blank-line separated blocks (trailing
    whitespace dropped, indentation kept), or for GovReport's one-line
    reports, runs of sentences of at least ``REPORT_PARAGRAPH_CHARS``."""
    if source != "govreport":
        blocks = (b.rstrip() for b in re.split(r"\n[ \t]*\n", text))
        return [b.strip("\n") for b in blocks if b.strip()]
    out, current = [], []
    for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z\"“(])", text.strip()):
        current.append(sentence)
        if sum(map(len, current)) + len(current) - 1 >= REPORT_PARAGRAPH_CHARS:
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def opening_of(paragraph: str, words: int) -> str | None:
    """The paragraph's first ``words`` whitespace-separated words, verbatim
    (line breaks kept); None for a shorter paragraph."""
    found = re.match(rf"(?:\S+\s+){{{words - 1}}}\S+(?=\s)", paragraph)
    return found.group(0) if found else None


def replace_word(text: str, old: str, new: str) -> str:
    """``old`` replaced by ``new`` wherever it stands as a whole word."""
    return re.sub(rf"(?<![A-Za-z0-9_]){re.escape(old)}(?![A-Za-z0-9_])", new, text)


def rename_target(source: str, paragraph: str, opening: str) -> str | None:
    """The word ``edit`` renames in a paragraph: the most frequent one that
    occurs at least twice, once after the opening, and that reads as a name:
    an identifier with an underscore or a call in the Python docs; elsewhere
    a capitalized word that stands mid-sentence at least once (a proper noun
    or an acronym, not a sentence's first word). None if there is no such word."""
    rest = paragraph[len(opening):]
    counts = Counter(re.findall(rf"(?<![A-Za-z0-9_]){_WORD}(?![A-Za-z0-9_])",
                                paragraph))

    def is_name(word: str) -> bool:
        if len(word) < 3 or keyword.iskeyword(word):
            return False
        if source == "pydoc":
            return "_" in word.strip("_") or bool(
                re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}\(", paragraph))
        return word[0].isupper() and bool(
            re.search(rf"[a-z0-9,;] {re.escape(word)}(?![A-Za-z0-9_])", paragraph))

    found = [w for w, n in counts.most_common() if n >= 2 and is_name(w)
             and replace_word(rest, w, "\0") != rest]
    return found[0] if found else None


# --------------------------------------------------------------------------- #
# prompts
# --------------------------------------------------------------------------- #
def chat_frame(tokenizer) -> tuple[str, str]:
    """The text before and after a user turn's content, up to where the
    assistant's answer starts (the tokenizer's chat template; a plain
    ``### Answer:`` line without one)."""
    if not getattr(tokenizer, "chat_template", None):
        return "", PLAIN_ANSWER
    mark = "\x00CONTENT\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": mark}],
                                         add_generation_prompt=True, tokenize=False)
    before, after = text.split(mark)
    return before, after


class _Stream:
    """The text's tokens, paragraph after paragraph (each followed by
    ``SEPARATOR``), read from document ``index`` of ``source`` on as needed."""

    def __init__(self, tokenizer, source: str, index: int):
        from benchmarks.longinput.inputs import encode

        self.encode = functools.partial(encode, tokenizer)
        self.separator = self.encode(SEPARATOR)
        self.source = source
        self.tokens: list[int] = []
        self.paragraphs: list[tuple[int, str, list[int]]] = []  # (offset, text, ids)
        docs = documents(source)
        self._read = (p for k in range(len(docs))
                      for p in paragraphs(source, docs[(index + k) % len(docs)]))

    def paragraph(self, j: int) -> tuple[int, str, list[int]] | None:
        """Paragraph ``j`` (offset, text, token ids); None past the source's end."""
        while len(self.paragraphs) <= j and self._more():
            pass
        return self.paragraphs[j] if j < len(self.paragraphs) else None

    def fill(self, n: int) -> bool:
        """Whether at least ``n`` tokens can be read."""
        while len(self.tokens) < n and self._more():
            pass
        return len(self.tokens) >= n

    def _more(self) -> bool:
        text = next(self._read, None)
        if text is None:
            return False
        ids = self.encode(text)
        self.paragraphs.append((len(self.tokens), text, ids))
        self.tokens += ids + self.separator
        return True


def copy_case(tokenizer, task: str, source: str, length: int, depth: float,
              index: int, *, opening_words: int = 10, min_tokens: int = 24,
              max_tokens: int = 96) -> CopyCase:
    """A ``task`` prompt of exactly ``length`` tokens whose paragraph starts
    at ``depth`` (0..1) of its text, from document ``index`` of ``source`` on.
    The paragraph is the first one of ``min_tokens``..``max_tokens`` tokens
    that has at least ``depth`` of the text before it, does not start with
    whitespace, and whose opening the text holds nowhere else; for ``edit``,
    one with a name to rename (``rename_target``), renamed to the first of
    ``NAMES`` / ``IDENTIFIERS`` the prompt's text does not hold."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {TASKS}")
    stream = _Stream(tokenizer, source, index)
    before, after = chat_frame(tokenizer)
    head = stream.encode(before + TEXT_HEAD)
    for j in itertools.count():
        found = stream.paragraph(j)
        if found is None:
            break
        offset, paragraph, ids = found
        opening = opening_of(paragraph, opening_words)
        if (not min_tokens <= len(ids) <= max_tokens or paragraph[0].isspace()
                or opening is None):
            continue
        old = rename_target(source, paragraph, opening) if task == "edit" else None
        if task == "edit" and old is None:
            continue
        for new in ([None] if old is None else
                    IDENTIFIERS if source == "pydoc" else NAMES):
            instruction = (QUOTE.format(opening=opening) if old is None else
                           EDIT.format(opening=opening, old=old, new=new))
            primed = opening if old is None else replace_word(opening, old, new)
            tail = stream.encode(TASK_HEAD + instruction + after + primed)
            size = length - len(head) - len(tail)
            at = round(depth * size)
            if offset < at:
                break  # too little text before it: a later paragraph
            if size < at + len(ids):
                break  # no room after it: a shorter paragraph
            if not stream.fill(offset - at + size):
                raise ValueError(f"cannot fit a {length}-token {task} prompt of "
                                 f"{source} text at depth {depth}")
            body = stream.tokens[offset - at:offset - at + size]
            text = tokenizer.decode(body)
            if text.count(opening) != 1:
                break  # ambiguous: a later paragraph
            if new is not None and new in text:
                continue  # the text holds the new name: the next one
            expected = paragraph if old is None else replace_word(paragraph, old, new)
            return CopyCase(
                task=task, source=source, prompt=head + body + tail, depth=depth,
                text_start=len(head), at=at, text_tokens=size, paragraph=paragraph,
                paragraph_tokens=len(ids), opening=opening, primed=primed,
                expected=expected[len(primed):], old=old, new=new)
    raise ValueError(f"{source} has no {length}-token {task} case at depth {depth} "
                     f"from document {index}")


def normalized(text: str) -> str:
    return " ".join(text.split())


def answered(case: CopyCase, output: str) -> bool:
    """Whether ``output`` (what the target wrote after the primed opening)
    is the expected paragraph, whitespace runs collapsed (PG-19's and the
    docs' line breaks may come out as spaces); text after it is allowed."""
    return normalized(output).startswith(normalized(case.expected))


def copied_tokens(case: CopyCase, decode, output: list[int]) -> int:
    """How many of the output's first tokens write the expected answer
    (whitespace runs collapsed): the answer's quoted span."""
    want = normalized(case.expected)
    for i in range(len(output)):
        if not want.startswith(normalized(decode(output[:i + 1]))):
            return i
    return len(output)


def score(case: CopyCase, decode, output: list[int], min_tokens: int) -> dict:
    """``correct``: the whole expected answer (``answered``); ``copied_tokens``:
    the quoted span (``copied_tokens``); ``kept``: whether the case counts,
    its span at least ``min_tokens`` tokens long and, for ``edit``, reaching
    past the first renamed name (a span that stops before it is only a quote)."""
    span = copied_tokens(case, decode, output)
    kept = span >= min_tokens
    if case.new is not None:
        want = normalized(case.expected)
        kept = kept and (len(normalized(decode(output[:span])))
                         >= want.find(case.new) + len(case.new))
    return {"correct": answered(case, decode(output)), "copied_tokens": span,
            "kept": kept}


def depths(num: int, low: float = 0.1, high: float = 0.9) -> list[float]:
    """``num`` depths spread evenly over ``low``..``high``."""
    if num == 1:
        return [(low + high) / 2]
    return [round(low + (high - low) * i / (num - 1), 4) for i in range(num)]


def cases(tokenizer, task: str, source: str, length: int, num: int,
          **kwargs) -> list[CopyCase]:
    """``num`` cases at depths spread over 10-90%, case ``i`` from document
    ``i * D // num`` on (of the source's ``D``): spread over the source, so
    that cases do not share a paragraph where documents are short (the
    Python docs)."""
    docs = len(documents(source))
    return [copy_case(tokenizer, task, source, length, depth, i * docs // num, **kwargs)
            for i, depth in enumerate(depths(num))]

