"""Training text for the draft: Python's own documentation, available offline.

The help topics of ``pydoc_data.topics`` (the language reference) and the
docstrings of the standard library's modules, classes and functions, read from
the source with ``ast`` (nothing is imported or executed). None of it is in the
GovReport / PG-19 evaluation sets. The order is deterministic for a given
Python version; the stdlib differs slightly between versions, so the recipe
records which one was used.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

# Tests, GUI demos and vendored packages: code-heavy or not documentation.
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib",
              "lib2to3", "turtledemo", "ensurepip", "tkinter"}
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def pydoc_topics() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[key].strip() for key in sorted(topics)]


def stdlib_docstrings(min_chars: int = 200, root: Path | None = None) -> list[str]:
    """Docstrings of at least ``min_chars`` characters, in file then tree order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(root).parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, _DOC_NODES):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars:
                    docs.append(doc)
    return docs


def python_docs(min_chars: int = 200) -> list[str]:
    """All training documents: help topics first, then stdlib docstrings."""
    return pydoc_topics() + stdlib_docstrings(min_chars)
