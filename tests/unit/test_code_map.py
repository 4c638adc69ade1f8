"""docs/design.md's code map ("## Layout") names every plugin module and only
those, and each plugin file stays short enough to read in one sitting
(issue #71). The map is the newcomer's way in: a module added, moved or
removed without it fails here, naming the file."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "vllm_specextend"
DESIGN = REPO / "docs" / "design.md"

MAX_LINES = 400
MAX_PROPOSER_LINES = 350
"""``proposer.py`` adapts vLLM's hooks only; the work lives in ``drafting/``."""

_ENTRY = re.compile(r"^( *)([\w.]+(?:/|\.py|\.pth))(?:\s|$)")


def code_map(text: str) -> set[str]:
    """The paths (from the repository root) that the Layout block's
    ``vllm_specextend/`` tree names: a line per file or folder, two spaces of
    indent a level; lines that go on describing the one before are skipped."""
    section = text.split("\n## Layout\n", 1)[1]
    block = section.split("```\n", 2)[1]
    named, stack = set(), []
    inside = False
    for line in block.splitlines():
        match = _ENTRY.match(line)
        if match is None or len(match.group(1)) % 2:
            continue
        depth, name = len(match.group(1)) // 2, match.group(2)
        if depth == 0:
            inside = name == "vllm_specextend/"
            stack = [name.rstrip("/")] if inside else []
            continue
        if not inside or depth > len(stack):
            continue
        del stack[depth:]
        path = "/".join([*stack, name.rstrip("/")])
        named.add(path)
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
    return named


def plugin_files() -> set[str]:
    """The package's modules (and its .pth), from the repository root; a
    package's ``__init__.py`` is its folder's entry."""
    found = set()
    for path in PACKAGE.rglob("*"):
        if "__pycache__" in path.parts or path.suffix not in (".py", ".pth"):
            continue
        rel = path.relative_to(REPO)
        found.add(str(rel.parent if rel.name == "__init__.py" else rel))
    found.discard("vllm_specextend")  # the tree's root
    return found


def test_code_map_reads_nesting_and_skips_descriptions():
    text = (
        "## Layout\n\n```\nvllm_specextend/\n"
        "  a.py               what a is,\n"
        "                     and more.py of it\n"
        "  room/              a room\n"
        "    b.py             b\n"
        "  c.py               c\n"
        "benchmarks/          not the plugin\n"
        "  d.py               d\n"
        "```\n"
    )
    assert code_map("intro\n" + text) == {
        "vllm_specextend/a.py", "vllm_specextend/room",
        "vllm_specextend/room/b.py", "vllm_specextend/c.py",
    }


def test_every_plugin_module_is_on_the_code_map():
    named, present = code_map(DESIGN.read_text()), plugin_files()
    assert "vllm_specextend/drafting/view.py" in named
    missing = sorted(present - named)
    assert missing == [], f"add to docs/design.md's Layout: {missing}"


def test_the_code_map_names_no_missing_file():
    named, present = code_map(DESIGN.read_text()), plugin_files()
    gone = sorted(named - present)
    assert gone == [], f"docs/design.md's Layout names what is not there: {gone}"


def test_no_plugin_file_is_longer_than_one_sitting():
    lengths = {str(p.relative_to(REPO)): len(p.read_text().splitlines())
               for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    assert "vllm_specextend/proposer.py" in lengths
    too_long = {path: n for path, n in sorted(lengths.items()) if n > MAX_LINES}
    assert too_long == {}, f"split these by job (at most {MAX_LINES} lines)"
    proposer = lengths["vllm_specextend/proposer.py"]
    assert proposer <= MAX_PROPOSER_LINES, (
        f"proposer.py has {proposer} lines (at most {MAX_PROPOSER_LINES}): move "
        "a cohesive group of methods into a mixin in drafting/")
