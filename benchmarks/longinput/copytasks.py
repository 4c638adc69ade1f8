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

``summary`` turns results files into the issue's summary rows: accepted
length (tokens per target forward) over the spans of the cases that count,
with intervals, and per-prompt pairs between modes.
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


# --------------------------------------------------------------------------- #
# the summary: results files -> accepted length per task, length and mode
# --------------------------------------------------------------------------- #
# Mode names in the summary (issue #46); a cmr mode ranking with another layer
# than the final one gets "_l<layer>" (cmr_l21).
SUMMARY_MODES = {"none": "plain", "draft_model": "full_kv", "self_full": "full_kv",
                 "streaming": "window", "self_streaming": "window", "cmr": "cmr",
                 "self_cmr": "cmr", "streaming_compact": "window_compact",
                 "cmr_compact": "cmr_compact", "ngram": "ngram"}


def summary_mode(row: dict) -> str:
    from benchmarks.longinput import engine, report

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
    from benchmarks.harness.meta import device
    from benchmarks.longinput import acceptance, report

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
    from benchmarks.longinput import acceptance

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
