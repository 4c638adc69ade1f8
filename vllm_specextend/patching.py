"""Declared patches: named changes to another library's objects, one registry.

A :class:`Patch` states what it changes (``target``, for people; ``attrs``, the
attribute names, or mapping keys with ``items=True``), why, and how
(``replace``: builds the new values from the owner and the caller's
arguments). A :class:`PatchRegistry` holds the one list of declared patches
and applies them to owners: a class or module once per process, or one
instance (an attention layer's impl, a runner). It

- refuses a patch that is not declared, and an attribute that some patch
  already replaced on that owner (two wrappers would silently stack);
- refuses to add an attribute the owner lacks, unless the patch says so: an
  upstream rename must fail here instead of adding a name nobody calls;
- records each original exactly as the owner held it (a ``staticmethod``
  stays one; an inherited attribute is marked absent), so :meth:`undo`
  restores the owner as it was.

Owners are held weakly where Python allows, so patching a runner or a layer
never keeps an engine alive. No vLLM import: tested on throwaway classes.
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

_ABSENT = object()
"""The owner did not hold the attribute itself (inherited or missing)."""


class PatchError(RuntimeError):
    """A patch that cannot be applied or undone as declared."""


@dataclass(frozen=True)
class Patch:
    """One declared change: ``replace(owner, *args)`` returns ``{attr: new}``
    for every name in ``attrs``; it runs before anything is written, so it
    reads the originals from ``owner``."""

    name: str
    target: str
    why: str
    attrs: tuple[str, ...]
    replace: Callable[..., dict[str, Any]] = field(repr=False)
    per_instance: bool = False
    items: bool = False
    """``attrs`` are keys of a mapping owner (``os.environ``), not attributes."""
    adds: bool = False
    """The attributes may be missing on the owner (an environment variable)."""
    undoable: bool = True
    """False where keeping the original would hold memory that must be freed
    (a replaced KV cache tensor): applied once, never undone."""


@dataclass(eq=False)
class _Applied:
    patch: Patch
    owner: Callable[[], Any]
    originals: dict[str, Any]


def _ref(owner: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(owner)
    except TypeError:  # e.g. SimpleNamespace, dict: no weak references
        return lambda: owner


def _describe(owner: Any) -> str:
    name = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None)
    return name or f"<{type(owner).__name__} at {id(owner):#x}>"


def _has(owner: Any, name: str, items: bool) -> bool:
    return name in owner if items else hasattr(owner, name)


def _read_own(owner: Any, name: str, items: bool) -> Any:
    """What undo must put back: the owner's own value, or ``_ABSENT`` where
    the value came from a class (undo deletes the attribute again)."""
    if items:
        return owner.get(name, _ABSENT)
    own = getattr(owner, "__dict__", {})
    if name in own:
        return own[name]  # as stored: a staticmethod stays one
    if isinstance(owner, (type, types.ModuleType)):
        return _ABSENT  # inherited from a base class
    try:
        static = inspect.getattr_static(type(owner), name)
    except AttributeError:
        static = _ABSENT
    if static is not _ABSENT and not hasattr(type(static), "__set__"):
        return _ABSENT  # a method or class attribute the instance shadows
    # Held another way: a data descriptor (``__class__``), a torch buffer.
    return getattr(owner, name, _ABSENT)


def _write(owner: Any, name: str, value: Any, items: bool) -> None:
    if items:
        owner[name] = value
    else:
        setattr(owner, name, value)


def _restore(owner: Any, name: str, original: Any, items: bool) -> None:
    if original is not _ABSENT:
        _write(owner, name, original, items)
    elif items:
        owner.pop(name, None)
    else:
        delattr(owner, name)


class PatchRegistry:
    """The declared patches and what of them is applied, to which owners."""

    def __init__(self, declared: Iterable[Patch]) -> None:
        self.declared = tuple(declared)
        names = [p.name for p in self.declared]
        if len(set(names)) != len(names):
            raise PatchError(f"patch names must be unique: {names}")
        self._applied: list[_Applied] = []

    def apply(self, patch: Patch, owner: Any, *args: Any) -> None:
        self._raise_if_undeclared(patch)
        self._prune()
        self._raise_if_patched(patch, owner)
        self._raise_if_missing(patch, owner)
        values = patch.replace(owner, *args)
        if set(values) != set(patch.attrs):
            raise PatchError(
                f"{patch.name} replaced {sorted(values)}, declared {list(patch.attrs)}"
            )
        originals = (
            {a: _read_own(owner, a, patch.items) for a in patch.attrs}
            if patch.undoable
            else {}
        )
        for name in patch.attrs:
            _write(owner, name, values[name], patch.items)
        self._applied.append(_Applied(patch, _ref(owner), originals))

    def is_applied(self, patch: Patch, owner: Any) -> bool:
        return self._record(patch, owner) is not None

    def undo(self, patch: Patch, owner: Any) -> None:
        record = self._record(patch, owner)
        if record is None:
            raise PatchError(f"{patch.name} is not applied to {_describe(owner)}")
        if not patch.undoable:
            raise PatchError(f"{patch.name} keeps no original and cannot be undone")
        for name, original in record.originals.items():
            _restore(owner, name, original, patch.items)
        self._applied.remove(record)

    def undo_all(self) -> None:
        """Latest first, so patches stacked on one owner unwind in order."""
        for record in reversed(list(self._applied)):
            owner = record.owner()
            if owner is not None and record.patch.undoable:
                self.undo(record.patch, owner)
        self._applied = [r for r in self._applied if not r.patch.undoable]

    def undo_since(self, before: list[tuple[Patch, Any]]) -> list[Patch]:
        """Undo, latest first, the undoable patches applied since ``before``
        (an ``applied()`` snapshot); returns them. Tests leave the registry
        as they found it so."""
        undone = []
        for patch, owner in reversed(self.applied()):
            new = not any(p is patch and o is owner for p, o in before)
            if new and patch.undoable:
                self.undo(patch, owner)
                undone.append(patch)
        return undone

    def applied(self) -> list[tuple[Patch, Any]]:
        """(patch, owner) for each patch applied to a live owner, in order."""
        self._prune()
        return [(r.patch, r.owner()) for r in self._applied]

    def _record(self, patch: Patch, owner: Any) -> _Applied | None:
        for record in self._applied:
            if record.patch is patch and record.owner() is owner:
                return record
        return None

    def _prune(self) -> None:
        self._applied = [r for r in self._applied if r.owner() is not None]

    def _raise_if_undeclared(self, patch: Patch) -> None:
        if not any(p is patch for p in self.declared):
            raise PatchError(f"{patch.name} is not in the declared patch list")

    def _raise_if_patched(self, patch: Patch, owner: Any) -> None:
        for record in self._applied:
            if record.owner() is not owner:
                continue
            taken = set(record.patch.attrs) & set(patch.attrs)
            if taken and record.patch.items == patch.items:
                raise PatchError(
                    f"{patch.name}: {sorted(taken)} of {_describe(owner)} already "
                    f"patched by {record.patch.name}"
                )

    def _raise_if_missing(self, patch: Patch, owner: Any) -> None:
        if patch.adds:
            return
        missing = [a for a in patch.attrs if not _has(owner, a, patch.items)]
        if missing:
            raise PatchError(
                f"{patch.name}: {_describe(owner)} has no {missing}; the patched "
                "upstream name moved (check the vLLM version)"
            )
