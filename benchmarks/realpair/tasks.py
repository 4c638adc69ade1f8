"""Long-prompt tasks for the real-pair benchmark (Qwen2.5-Coder-1.5B-Instruct
target, 0.5B draft): answers that copy from the long input, and answers that
do not.

A cell is a ``context`` (the prompt's length in tokens, chat template applied:
``LOW_SHARE``..1 of it, never over) and a ``group``; its ``n`` prompts take
the group's kinds in turn:

* ``copy``: ``quote_code`` (quote a function), ``rename_code`` (the function
  with a parameter or local variable renamed), ``quote_prose`` (repeat a
  paragraph verbatim), ``edit_prose`` (that paragraph with a name replaced);
* ``other``: ``explain_code`` (explain a function), ``summarize_report``
  (summarise the text's last GovReport report).

Text (``corpus``): whole Python files for the code kinds; PG-19 books or
GovReport reports (in turn) for the prose ones; the report to summarise comes
last, after other reports. Every prompt of a set starts at a file or document
no other one starts at (prefix caching shares nothing past the system turn),
and is filled to its length, cut at a file's or document's end where that
lands in the window, else at a line's (a word's at worst). The function
(``TOKENS``: 120-420 tokens) or paragraph (60-300) is unique in the text
(``def NAME(``, the paragraph's opening words) and starts at a depth (the
share of the text's tokens before it) in ``DEPTH``, the depths of one kind
spread over that range in a cell. The prompt is one user turn (the
tokenizer's chat template and its default system prompt; a plain
``### Text:`` / ``### Task:`` / ``### Answer:`` layout without one): the
text, a blank line, the instruction.

CLI, from the repository root::

    python -m benchmarks.realpair.tasks build OUT.jsonl.gz --tokenizer DIR \\
        [--contexts 8192 16384 30720] [--n 16] [--code-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import math
import random
import re
import textwrap
import time
from dataclasses import dataclass

from benchmarks.longinput.copytasks import (
    NAMES,
    opening_of,
    rename_target,
    replace_word,
)
from benchmarks.realpair import corpus
from benchmarks.realpair.corpus import SEP, word_pattern

CONTEXTS = (8192, 16384, 30720)
GROUPS = {"copy": ("quote_code", "rename_code", "quote_prose", "edit_prose"),
          "other": ("explain_code", "summarize_report")}
CODE_KINDS = ("quote_code", "rename_code", "explain_code")
LOW_SHARE = 0.97
DEPTH = (0.1, 0.6)
TOKENS = {"code": (120, 420), "prose": (60, 300)}
MAX_TOKENS = {"explain_code": 256, "summarize_report": 384}
COPY_SLACK, COPY_CAP = 64, 512
OPENING_WORDS = 8
NEW_NAMES = ("tally", "scratch", "holder", "cursor", "bucket", "marker", "ledger",
             "pivot", "widget", "anchor")
INSTRUCTIONS = {
    "quote_code": "Quote the function `{name}` from the code above exactly as "
                  "written, in one ```python block, and nothing else.",
    "rename_code": "Rewrite the function `{name}` from the code above with the "
                   "{what} `{old}` renamed to `{new}` everywhere inside it, and "
                   "nothing else changed. Output only the rewritten function, "
                   "in one ```python block.",
    "explain_code": "Explain in a short paragraph what the function `{name}` does.",
    "quote_prose": 'Repeat verbatim the paragraph of the text above that begins '
                   'with "{opening}". Output only that paragraph.',
    "edit_prose": 'Repeat the paragraph of the text above that begins with '
                  '"{opening}", with every "{old}" replaced by "{new}". Output '
                  'only that paragraph.',
    "summarize_report": 'Summarize the last report in the text above (the one '
                        'that begins "{opening}") in one paragraph.',
}
SUMMARY_SHARE = 0.6  # the summarised report: at most this share of the context
SUMMARY_MIN_TOKENS = 256
FORMAT = "realpair-cases/1"


@dataclass(frozen=True)
class Case:
    id: str
    group: str
    kind: str
    context: int
    prompt_ids: list[int]
    prompt_tokens: int
    max_tokens: int
    expected: str | None  # the answer (copy kinds), reference summary, or None
    meta: dict


# --------------------------------------------------------------------------- #
# scoring
# --------------------------------------------------------------------------- #
_STOP = frozenset("about above after again against among because before being "
                  "below between could during other should their there these "
                  "those through under until where which while would  shall "
                  "since within without whether".split())


def fenced(answer: str) -> str:
    """The first ``` fenced block's body (to the answer's end if unclosed),
    or the whole answer without one."""
    found = re.search(r"```[^\n`]*\n(.*?)(?:```|\Z)", answer, re.S)
    return found.group(1) if found else answer


def _code_form(text: str) -> str:
    lines = [line.rstrip() for line in text.split("\n")]
    return textwrap.dedent("\n".join(lines).strip("\n"))


def _content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 5} - _STOP


def check(case: Case, answer: str) -> bool | None:
    """Whether ``answer`` does the task.

    Copy kinds: the first fenced block (or the whole answer) equals
    ``expected``, code with trailing spaces, leading/trailing blank lines and
    common indentation dropped (a method quoted at column 0 counts), prose
    with whitespace runs collapsed. ``explain_code``: a weak check, the answer
    is not empty and names the function. ``summarize_report``: a crude recall
    heuristic, at least 30% of the reference summary's distinct content words
    (lowercase letters, 5 or more, a few function words left out) occur in
    the answer; None without a reference."""
    if case.kind in ("quote_code", "rename_code"):
        return _code_form(fenced(answer)) == _code_form(case.expected)
    if case.kind in ("quote_prose", "edit_prose"):
        return " ".join(fenced(answer).split()) == " ".join(case.expected.split())
    if case.kind == "explain_code":
        return bool(answer.strip()) and case.meta["function"] in answer
    if not case.expected:
        return None
    want = _content_words(case.expected)
    return bool(want) and len(want & _content_words(answer)) >= 0.3 * len(want)


# --------------------------------------------------------------------------- #
# building
# --------------------------------------------------------------------------- #
class _Builder:
    def __init__(self, tokenizer, code_dir: str | None, seed: int):
        self.tok = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self.code_dir = str(code_dir or corpus.default_code_dir())
        self.seed = seed
        self.orders: dict[str, list[int]] = {}
        self.used: set = set()
        self.counts: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def count(self, blk) -> int:
        """A file's or document's tokens, counted once a build."""
        if blk.name not in self.counts:
            self.counts[blk.name] = len(self.encode(blk.block))
        return self.counts[blk.name]

    def prompt(self, text: str, instruction: str) -> list[int]:
        if not self.chat:
            plain = f"### Text:\n\n{text}\n\n### Task:\n{instruction}\n\n### Answer:\n"
            return list(self.tok(plain)["input_ids"])
        out = self.tok.apply_chat_template(
            [{"role": "user", "content": f"{text}\n\n{instruction}"}],
            add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if hasattr(out, "keys") else out)

    def order(self, source: str, size: int) -> list[int]:
        """``range(size)`` in a seeded order of ``source``'s."""
        if source not in self.orders:
            order = list(range(size))
            random.Random(f"{self.seed}-{source}").shuffle(order)
            self.orders[source] = order
        return self.orders[source]

    def starts(self, source: str):
        """Start indices (files or documents), each given once in a build."""
        order = self.order(source, corpus.count(source, self.code_dir))
        while order:
            yield order.pop(0)

    def blocks(self, source: str, first: int, tokens: int, skip=None) -> list:
        """Files or documents from ``first`` on (in order, wrapping round)
        until they hold over ``tokens`` tokens, or all; none if ``first`` is
        left out."""
        size, out, est = corpus.count(source, self.code_dir), [], 0
        for k in range(size):
            i = (first + k) % size
            blk = None if i == skip else corpus.block(source, i, self.code_dir)
            if blk is None and k == 0:
                return []
            if blk is not None:
                out.append(blk)
                est += self.count(blk) + 1
                if est > tokens:
                    break
        return out

    def fit(self, head: corpus.Joined, instruction: str, context: int, tail=""):
        """(text, prompt ids, cut) with ``head`` cut so that the prompt (with
        ``tail`` after the head) fits ``LOW_SHARE``..1 of ``context``; None
        if the head is too short. A block's end is taken where it lands in
        the window with a margin, else a line's, else a word's."""
        margin = max(4, context // 400)
        low, goal = math.ceil(LOW_SHARE * context), context - margin
        frame = len(self.prompt("", instruction)) + (
            len(self.encode(SEP + tail)) if tail else 0)
        budget = goal - frame
        for _ in range(8):
            end = head.cut(budget, low - frame + margin)
            text = head.text[:end].rstrip() + (SEP + tail if tail else "")
            ids = self.prompt(text, instruction)
            if low <= len(ids) <= context:
                return text, ids, end
            if end == len(head.text) and len(ids) < low:
                return None
            budget += goal - len(ids)
        return None

    def copied(self, kind: str, source: str, context: int, depth: float,
               serial: int) -> dict:
        """A function (``source`` "code") or paragraph case: the candidates of
        ``TOKENS`` tokens at a depth in ``DEPTH`` (estimated before the cut),
        nearest ``depth`` first, until one makes a case (``attempt``)."""
        lo, hi = TOKENS["code" if source == "code" else "prose"]
        for start in self.starts(source):
            blocks = self.blocks(source, start, context)
            if not blocks:
                continue
            head = corpus.Joined(self.tok, blocks)
            found = []
            for blk, at in zip(blocks, head.starts, strict=True):
                for offset, span, item in blk.spans:
                    pos = at + offset
                    d = head.upto(pos) / (context - 64)
                    size = head.upto(pos + len(span)) - head.upto(pos)
                    if (DEPTH[0] + .01 <= d <= DEPTH[1] - .01 and lo <= size <= hi
                            and (blk.name, offset) not in self.used):
                        found.append((abs(d - depth), pos, offset, blk, item))
            for _, pos, offset, blk, item in sorted(found, key=lambda c: c[:2]):
                made = self.attempt(kind, context, head, pos, blk, item, serial)
                if made:
                    self.used.add((blk.name, offset))
                    return made
        raise ValueError(f"no {kind} case of {context} tokens from {source}")

    def task(self, kind: str, head, blk, item, serial: int):
        """(instruction fields, expected answer, a pattern the text must hold
        once, meta) for a function or paragraph; None if it does not fit."""
        if kind in CODE_KINDS:
            fields, expected = {"name": item.name}, item.source
            if kind == "rename_code":
                if not item.locals:
                    return None
                old = item.locals[0]
                new = next(n for n in NEW_NAMES[serial % len(NEW_NAMES):] + NEW_NAMES
                           if not re.search(word_pattern(n), item.source))
                what = "parameter" if old in item.params else "local variable"
                fields.update(old=old, new=new, what=what)
                expected = replace_word(item.source, old, new)
            meta = dict(source=self.code_dir, file=blk.path, function=item.name,
                        qualname=item.qualname)
            return (fields, expected, rf"(?<![\w.])def\s+{item.name}\s*\(", meta)
        opening = opening_of(item, OPENING_WORDS)
        if opening is None or not item[0].isalnum():
            return None
        fields, expected = {"opening": " ".join(opening.split())}, item
        if kind == "edit_prose":
            old = rename_target(blk.source, item, opening)
            names = NAMES[serial % len(NAMES):] + NAMES
            new = next((n for n in names if n not in head.text), None)
            if old is None or new is None:
                return None
            fields.update(old=old, new=new)
            expected = replace_word(item, old, new)
        meta = dict(source=blk.source, document=blk.index, paragraph=item[:80],
                    opening=fields["opening"])
        return fields, expected, re.escape(opening), meta

    def attempt(self, kind, context, head, pos, blk, item, serial) -> dict | None:
        """The case, if the item makes one: the prompt fits, the text holds
        the item's pattern once and its depth after the cut is in ``DEPTH``."""
        task = self.task(kind, head, blk, item, serial)
        if task is None:
            return None
        fields, expected, once, meta = task
        fitted = self.fit(head, INSTRUCTIONS[kind].format(**fields), context)
        if fitted is None:
            return None
        text, ids, end = fitted
        depth = head.upto(pos) / head.upto(end)
        if len(re.findall(once, text)) != 1 or not DEPTH[0] <= depth <= DEPTH[1]:
            return None
        meta.update(first=head.names[0], depth=round(depth, 4), old=fields.get("old"),
                    new=fields.get("new"))
        if kind == "explain_code":
            return _made(kind, context, ids, None, MAX_TOKENS[kind], meta)
        return _made(kind, context, ids, expected, min(
            COPY_CAP, len(self.encode(expected)) + COPY_SLACK), meta)

    def summary(self, context: int) -> dict:
        """The last block: a report with a reference summary, of
        ``SUMMARY_MIN_TOKENS``..``SUMMARY_SHARE`` of the context, each
        summarised once if there are enough; before it, other reports from a
        start of their own (all of them after books if they run out). Its
        depth: the share of the prompt before it."""
        n = corpus.count("govreport", self.code_dir)
        docs = [corpus.prose_doc("govreport", i) for i in range(n)]
        fits = [i for i in self.order("summary", n) if corpus.reference(i) and
                SUMMARY_MIN_TOKENS <= self.count(docs[i]) <= SUMMARY_SHARE * context]
        if not fits:
            raise ValueError(f"no report to summarise in {context} tokens")
        report = next((i for i in fits if ("report", i) not in self.used), fits[0])
        self.used.add(("report", report))
        last = docs[report]
        start = next((i for i in self.starts("govreport") if i != report), None)
        blocks = [] if start is None else self.blocks("govreport", start, context,
                                                       skip=report)
        tail = [last]
        if sum(map(self.count, blocks + tail)) < context:  # too few reports
            tail = blocks + tail  # all of them, after books
            blocks = self.blocks("pg19", next(self.starts("pg19")), context - sum(
                map(self.count, tail)) + 64)
        head = corpus.Joined(self.tok, blocks)
        opening = " ".join(last.block.split()[1:1 + OPENING_WORDS])
        instruction = INSTRUCTIONS["summarize_report"].format(opening=opening)
        fitted = self.fit(head, instruction, context, SEP.join(d.block for d in tail))
        if fitted is None:
            raise ValueError(f"cannot fill {context} tokens before report {report}")
        _, ids, end = fitted
        filler = [name for name, at in zip(head.names, head.starts, strict=True)
                  if at < end]
        filler += [d.name for d in tail[:-1]]
        meta = dict(source="govreport", document=report, first=filler[0],
                    opening=opening, filler=filler,
                    depth=round(1 - self.count(last) / len(ids), 4))
        return _made("summarize_report", context, ids, corpus.reference(report),
                     MAX_TOKENS["summarize_report"], meta)


def _made(kind, context, ids, expected, max_tokens, meta) -> dict:
    return dict(kind=kind, context=context, prompt_ids=ids, prompt_tokens=len(ids),
                max_tokens=max_tokens, expected=expected, meta=meta)


def build_cases(tokenizer, contexts=CONTEXTS, groups=("copy", "other"), n=16,
                code_dir=None, seed=0) -> list[Case]:
    """The task set: for each context and group, ``n`` cases (deterministic
    for a tokenizer, code directory, data directory and seed)."""
    b = _Builder(tokenizer, code_dir, seed)
    cases = []
    for context in contexts:
        for group in groups:
            kinds = GROUPS[group]
            for i in range(n):
                kind = kinds[i % len(kinds)]
                j, m = i // len(kinds), len(range(i % len(kinds), n, len(kinds)))
                depth = DEPTH[0] + (DEPTH[1] - DEPTH[0]) * (j + 0.5) / m
                if kind == "summarize_report":
                    made = b.summary(context)
                else:
                    source = ("code" if kind in CODE_KINDS
                              else ("pg19", "govreport")[j % 2])
                    made = b.copied(kind, source, context, depth, i)
                cases.append(Case(id=f"{group}-{context}-{i:02d}-{kind}",
                                  group=group, **made))
    return cases


# --------------------------------------------------------------------------- #
# files
# --------------------------------------------------------------------------- #
def _line(case: Case) -> str:
    return json.dumps(dataclasses.asdict(case), sort_keys=True, ensure_ascii=False)


def cases_sha256(cases: list[Case]) -> str:
    digest = hashlib.sha256()
    for case in cases:
        digest.update(_line(case).encode() + b"\n")
    return digest.hexdigest()


def _open(path, mode: str):
    path = str(path)
    return (gzip.open(path, mode + "t", encoding="utf-8") if path.endswith(".gz")
            else open(path, mode, encoding="utf-8"))


def save_cases(cases: list[Case], path, tokenizer=None, **extra) -> dict:
    """Write a header line (format, tokenizer name and vocabulary size,
    count, sha256 of the cases, ``extra``) then one case a line; gzip for a
    path ending in ``.gz``. Returns the header."""
    header = dict(format=FORMAT, count=len(cases), sha256=cases_sha256(cases),
                  tokenizer=getattr(tokenizer, "name_or_path", None),
                  vocab_size=len(tokenizer) if tokenizer is not None else None,
                  **extra)
    with _open(path, "w") as fh:
        fh.write(json.dumps(header, sort_keys=True) + "\n")
        for case in cases:
            fh.write(_line(case) + "\n")
    return header


def load_cases(path) -> tuple[dict, list[Case]]:
    """(header, cases) of a ``save_cases`` file, the cases checked against the
    header's sha256."""
    with _open(path, "r") as fh:
        header = json.loads(fh.readline())
        cases = [Case(**json.loads(line)) for line in fh if line.strip()]
    if header.get("format") != FORMAT or cases_sha256(cases) != header["sha256"]:
        raise ValueError(f"{path}: not a {FORMAT} file, or its cases do not match "
                         "its sha256")
    return header, cases


def table(cases: list[Case]) -> list[str]:
    """One line a cell: prompts, mean prompt and max tokens, and the range of
    depths of its functions and paragraphs (not the summarised reports')."""
    cells: dict[tuple, list[Case]] = {}
    for case in cases:
        cells.setdefault((case.group, case.context), []).append(case)
    rows = [f"{'cell':<14} {'prompts':>7} {'prompt tok':>10} {'max tok':>8}  depth"]
    for (group, context), got in cells.items():
        depths = [c.meta["depth"] for c in got if c.kind != "summarize_report"]
        rows.append(
            f"{group + '-' + str(context):<14} {len(got):>7} "
            f"{sum(c.prompt_tokens for c in got) / len(got):>10.0f} "
            f"{sum(c.max_tokens for c in got) / len(got):>8.0f}  "
            f"{min(depths):.2f}-{max(depths):.2f}" if depths else "-")
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the task set into a .jsonl(.gz)")
    build.add_argument("out")
    build.add_argument("--tokenizer", required=True)
    build.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    build.add_argument("--groups", nargs="+", default=list(GROUPS),
                       choices=list(GROUPS))
    build.add_argument("--n", type=int, default=16)
    build.add_argument("--code-dir", default=None)
    build.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    began = time.monotonic()
    cases = build_cases(tokenizer, tuple(args.contexts), tuple(args.groups), args.n,
                        args.code_dir, args.seed)
    header = save_cases(cases, args.out, tokenizer, seed=args.seed,
                        code_dir=args.code_dir or corpus.default_code_dir())
    for row in table(cases):
        print(row)  # noqa: T201
    print(f"{len(cases)} cases in {time.monotonic() - began:.1f} s -> {args.out} "  # noqa: T201
          f"(sha256 {header['sha256'][:16]})")


if __name__ == "__main__":
    main()
