"""The texts of the real-pair tasks (``tasks``): Python files and prose.

Code: the ``.py`` files under a directory (default: the running interpreter's
standard library), by relative path, leaving out ``test``/``tests`` folders,
``site-packages``, files ``ast`` cannot parse and files with a line over
``LONG_LINE`` characters. A file enters a prompt as a block: a line
``# File: relative/path.py``, then its text. Its functions are its top-level
functions and its top-level classes' methods, from the ``def`` line to the
last one (decorators left out), of ``FUNCTION_LINES`` lines, without tabs or
lines over ``FUNCTION_WIDTH`` characters.

Prose: PG-19 books and GovReport reports (``benchmarks.prompts``), in the
paragraphs ``benchmarks.longinput.copytasks.paragraphs`` makes of them
(blank-line separated blocks; a report's sentences grouped into paragraphs of
about 200 characters), without the data files' ``<s>`` / ``### Summary:``
marks and a last paragraph cut off mid-sentence (``clean``). A document
enters a prompt as a block: a line ``[Book]`` or ``[Report]``, then its
paragraphs, blank-line separated.
GovReport's reference summaries (the rows' ``answer``) come with ``reference``.
"""

from __future__ import annotations

import ast
import bisect
import builtins
import functools
import keyword
import os
import re
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks import prompts as text_data
from benchmarks.longinput.copytasks import paragraphs

SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})
LONG_LINE = 200
FUNCTION_LINES = (12, 60)
FUNCTION_WIDTH = 100
HEADERS = {"pg19": "[Book]", "govreport": "[Report]"}
SEP = "\n\n"  # between blocks, and between a prose block's paragraphs
_NOT_LOCAL = frozenset({"self", "cls"}) | frozenset(dir(builtins))


def word_pattern(word: str) -> str:
    """``word`` as a whole identifier (no letter, digit or ``_`` either side)."""
    return rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])"


@dataclass(frozen=True)
class Function:
    name: str
    qualname: str  # ``Class.name`` for a method
    offset: int  # where its ``def`` line starts in the file's text
    source: str  # its lines as the file holds them (a method's indentation kept)
    params: tuple[str, ...]
    locals: tuple[str, ...]  # names ``rename_code`` may rename, best first


@dataclass(frozen=True)
class CodeFile:
    path: str  # relative to the corpus directory, with ``/``
    text: str
    functions: tuple[Function, ...]

    @property
    def header(self) -> str:
        return f"# File: {self.path}\n"

    @property
    def block(self) -> str:
        return self.header + self.text

    @property
    def name(self) -> str:
        return self.path

    @property
    def spans(self) -> tuple:
        """(offset in the block, text, function) of each function."""
        return tuple((len(self.header) + fn.offset, fn.source, fn)
                     for fn in self.functions)


def default_code_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


@functools.cache
def code_paths(code_dir: str) -> tuple[str, ...]:
    """The corpus's candidate files, sorted (not yet read: see ``code_file``)."""
    root = Path(code_dir)
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        found += [(Path(folder) / f).relative_to(root).as_posix()
                  for f in files if f.endswith(".py")]
    if not found:
        raise FileNotFoundError(f"no .py files under {code_dir}")
    return tuple(sorted(found))


@functools.cache
def code_file(code_dir: str, path: str) -> CodeFile | None:
    """The file's text and functions; None for a file the corpus leaves out."""
    try:
        text = (Path(code_dir) / path).read_text(encoding="utf-8").rstrip()
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.split("\n")
    if not text or "\0" in text or max(map(len, lines)) > LONG_LINE:
        return None
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    found = []
    for node, owner in _defs(tree):
        body = lines[node.lineno - 1:node.end_lineno]
        if (not FUNCTION_LINES[0] <= len(body) <= FUNCTION_LINES[1]
                or any("\t" in b or len(b) > FUNCTION_WIDTH for b in body)):
            continue
        source = "\n".join(body)
        found.append(Function(
            name=node.name, qualname=f"{owner}.{node.name}" if owner else node.name,
            offset=starts[node.lineno - 1], source=source, params=_params(node),
            locals=_renamable(node, source)))
    return CodeFile(path=path, text=text, functions=tuple(found))


def _defs(tree: ast.Module):
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, kinds):
            yield node, None
        elif isinstance(node, ast.ClassDef):
            yield from ((n, node.name) for n in node.body if isinstance(n, kinds))


def _params(node: ast.AST) -> tuple[str, ...]:
    a = node.args
    return tuple(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg,
                                 a.kwarg) if x is not None)


def _renamable(node: ast.AST, source: str) -> tuple[str, ...]:
    """Parameters and assigned names of at least 3 characters (not ``self``,
    ``cls``, a builtin's or a dunder), used at least 3 times, whose every
    whole-identifier occurrence in ``source`` is a use of the name (none in an
    attribute, a keyword argument, a string or a comment), so that a regex
    rename is the rename. Most used first."""
    walked = list(ast.walk(node))
    stored = [n.id for n in walked if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)]
    uses = Counter([n.id for n in walked if isinstance(n, ast.Name)]
                   + [n.arg for n in walked if isinstance(n, ast.arg)])
    ranked = []
    for name in dict.fromkeys([*_params(node), *stored]):
        if (len(name) < 3 or name in _NOT_LOCAL or keyword.iskeyword(name)
                or name.startswith("__")):
            continue
        count = len(re.findall(word_pattern(name), source))
        if count >= 3 and count == uses[name]:
            ranked.append((-count, name))
    return tuple(name for _, name in sorted(ranked, key=lambda r: r[0]))


# --------------------------------------------------------------------------- #
# blocks joined
# --------------------------------------------------------------------------- #
class Joined:
    """Blocks (files, documents) joined by blank lines and tokenized once,
    with character offsets: how many tokens come before a position, and
    where the text may end."""

    def __init__(self, tokenizer, blocks: list):
        self.names = [b.name for b in blocks]
        self.text = SEP.join(b.block for b in blocks)
        self.starts = [0]
        for b in blocks[:-1]:
            self.starts.append(self.starts[-1] + len(b.block) + len(SEP))
        enc = tokenizer(self.text, add_special_tokens=False,
                        return_offsets_mapping=True)
        self.ends = [end for _, end in enc["offset_mapping"]]
        self._cuts: dict[str, tuple[list[int], list[int]]] = {}

    def upto(self, pos: int) -> int:
        """How many of the text's tokens end by character ``pos``."""
        return bisect.bisect_right(self.ends, pos)

    def cuts(self, level: str) -> tuple[list[int], list[int]]:
        """(positions, tokens before them) where the text may end: after a
        ``block``, a ``line`` or a ``word``."""
        if level not in self._cuts:
            if level == "block":
                at = [s - len(SEP) for s in self.starts[1:]]
            else:
                at = [m.start() for m in re.finditer(
                    "\n" if level == "line" else r"\s", self.text)]
            at.append(len(self.text))
            self._cuts[level] = (at, [self.upto(c) for c in at])
        return self._cuts[level]

    def cut(self, tokens: int, floor: int) -> int:
        """Where the text ends: the last block end at most ``tokens`` in if it
        is at least ``floor`` in, else the last line end so, else word end."""
        for level in ("block", "line", "word"):
            at, before = self.cuts(level)
            i = bisect.bisect_right(before, tokens) - 1
            if i >= 0 and (before[i] >= floor or level == "word"):
                return at[i]
        return 0


# --------------------------------------------------------------------------- #
# prose
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class ProseDoc:
    source: str
    index: int
    block: str
    paragraphs: tuple[tuple[int, str], ...]  # (offset in the block, text)

    @property
    def name(self) -> str:
        return f"{self.source}:{self.index}"

    @property
    def spans(self) -> tuple:
        """(offset in the block, text, text) of each paragraph."""
        return tuple((offset, para, para) for offset, para in self.paragraphs)


def documents(source: str) -> tuple[str, ...]:
    return text_data.load_texts(source)


def prose_doc(source: str, index: int) -> ProseDoc:
    return _prose_doc(str(text_data.data_dir()), source, index)


def clean(text: str) -> str:
    """A document without the data files' ``<s>`` before it and ``### Summary:``
    after it."""
    text = re.sub(r"\A\s*<s>", "", text)
    return re.sub(r"\s*### Summary:\s*\Z", "", text).strip()


@functools.cache
def _prose_doc(data_dir: str, source: str, index: int) -> ProseDoc:
    block, found = HEADERS[source], []
    paras = paragraphs(source, clean(documents(source)[index]))
    if len(paras) > 1 and not re.search(r"[.!?:;\"'”’)\]]\Z", paras[-1]):
        paras.pop()  # cut off mid-sentence: documents are truncated copies
    for para in paras:
        block += SEP
        found.append((len(block), para))
        block += para
    return ProseDoc(source=source, index=index, block=block, paragraphs=tuple(found))


def count(source: str, code_dir: str) -> int:
    """How many files (``source`` "code") or documents the source has."""
    return len(code_paths(code_dir) if source == "code" else documents(source))


def block(source: str, index: int, code_dir: str) -> CodeFile | ProseDoc | None:
    """File or document ``index`` of ``source`` (None: a file left out)."""
    if source == "code":
        return code_file(code_dir, code_paths(code_dir)[index])
    return prose_doc(source, index)


def reference(index: int) -> str | None:
    """GovReport document ``index``'s reference summary (None if it has none)."""
    doc = documents("govreport")[index]
    return _answers(str(text_data.data_dir())).get(text_data.doc_key(doc))


@functools.cache
def _answers(data_dir: str) -> dict[str, str]:
    """Reference summaries by document (``data_dir``: the cache's key)."""
    found: dict[str, str] = {}
    for text, row in text_data.rows("govreport"):
        key = text_data.doc_key(text)
        if row.get("answer") and key not in found:
            found[key] = row["answer"].strip()
    return found
