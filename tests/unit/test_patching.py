"""The patch mechanism (``vllm_specextend.patching``) on throwaway classes."""

from __future__ import annotations

import functools
import gc

import pytest
import torch

from vllm_specextend.patching import Patch, PatchError, PatchRegistry


def _wrap(owner, name, tag):
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        return (tag, original(*args, **kwargs))

    return wrapped


class Base:
    def greet(self):
        return "base"

    @staticmethod
    def make(x):
        return x + 1


class Child(Base):
    pass


GREET = Patch(
    name="Base.greet", target="Base.greet", why="test", attrs=("greet",),
    replace=lambda owner, tag: {"greet": _wrap(owner, "greet", tag)},
)
MAKE = Patch(
    name="Base.make", target="Base.make", why="test", attrs=("make",),
    replace=lambda owner: {"make": staticmethod(_wrap(owner, "make", "wrapped"))},
)
OTHER_GREET = Patch(
    name="Other.greet", target="Base.greet", why="test", attrs=("greet",),
    replace=lambda owner: {"greet": lambda self: "other"},
)


def _registry(*patches):
    return PatchRegistry(patches or (GREET, MAKE, OTHER_GREET))


def test_apply_and_undo_a_class_method():
    reg = _registry()
    original = Base.__dict__["greet"]
    reg.apply(GREET, Base, "t")
    assert Base().greet() == ("t", "base")
    assert reg.is_applied(GREET, Base) and not reg.is_applied(GREET, Child)
    assert reg.applied() == [(GREET, Base)]
    reg.undo(GREET, Base)
    assert Base.__dict__["greet"] is original and Base().greet() == "base"
    assert reg.applied() == []


def test_staticmethod_stays_static_after_undo():
    reg = _registry()
    raw = Base.__dict__["make"]
    reg.apply(MAKE, Base)
    assert Base.make(1) == ("wrapped", 2) and Base().make(1) == ("wrapped", 2)
    assert isinstance(Base.__dict__["make"], staticmethod)
    reg.undo(MAKE, Base)
    assert Base.__dict__["make"] is raw and Base.make(1) == 2


def test_inherited_attribute_is_deleted_again():
    reg = _registry()
    reg.apply(GREET, Child, "c")
    assert Child().greet() == ("c", "base") and Base().greet() == "base"
    reg.undo(GREET, Child)
    assert "greet" not in Child.__dict__ and Child().greet() == "base"


def test_the_same_attribute_is_never_patched_twice():
    reg = _registry()
    reg.apply(GREET, Base, "t")
    try:
        with pytest.raises(PatchError, match="already patched by Base.greet"):
            reg.apply(GREET, Base, "again")
        with pytest.raises(PatchError, match="already patched by Base.greet"):
            reg.apply(OTHER_GREET, Base)
        assert Base().greet() == ("t", "base"), "a refused patch writes nothing"
        # Another owner is another attribute.
        reg.apply(OTHER_GREET, Child)
        assert Child().greet() == "other"
    finally:
        reg.undo_all()
    assert Base().greet() == "base" and "greet" not in Child.__dict__


def test_only_declared_patches_apply():
    with pytest.raises(PatchError, match="not in the declared"):
        _registry(GREET).apply(MAKE, Base)
    with pytest.raises(PatchError, match="unique"):
        PatchRegistry([GREET, GREET])


def test_a_missing_attribute_fails_unless_the_patch_adds_it():
    renamed = Patch(name="Base.hello", target="Base.hello", why="test",
                    attrs=("hello",), replace=lambda owner: {"hello": 1})
    with pytest.raises(PatchError, match="has no \\['hello'\\]"):
        _registry(renamed).apply(renamed, Base)
    assert not hasattr(Base, "hello")
    adds = Patch(name="Base.hello", target="Base.hello", why="test",
                 attrs=("hello",), replace=lambda owner: {"hello": 1}, adds=True)
    reg = _registry(adds)
    reg.apply(adds, Base)
    assert Base.hello == 1
    reg.undo(adds, Base)
    assert not hasattr(Base, "hello")


def test_replace_must_return_the_declared_attributes():
    bad = Patch(name="bad", target="Base", why="test", attrs=("greet",),
                replace=lambda owner: {"greet": 1, "extra": 2})
    with pytest.raises(PatchError, match="declared"):
        _registry(bad).apply(bad, Base)
    assert Base().greet() == "base"


def test_per_instance_patches_and_weak_owners():
    per = Patch(name="Thing.greet", target="one Thing", why="test", attrs=("greet",),
                replace=lambda owner, tag: {"greet": lambda: tag}, per_instance=True)
    reg = _registry(per)
    a, b = Child(), Child()
    reg.apply(per, a, "a")
    reg.apply(per, b, "b")
    assert (a.greet(), b.greet(), Child().greet()) == ("a", "b", "base")
    reg.undo(per, a)
    assert a.greet() == "base" and "greet" not in vars(a)
    del b
    gc.collect()
    assert reg.applied() == [], "a collected owner is no longer patched"


def test_class_swap_and_data_descriptors():
    class Action:
        def __call__(self):
            return "plain"

    class Merging(Action):
        def __call__(self):
            return "merging"

    class Holder:
        def __init__(self):
            self._x = 1

        @property
        def x(self):
            return self._x

        @x.setter
        def x(self, value):
            self._x = value

    swap = Patch(name="action.__class__", target="an action", why="test",
                 attrs=("__class__",), replace=lambda owner: {"__class__": Merging})
    prop = Patch(name="Holder.x", target="a holder", why="test", attrs=("x",),
                 replace=lambda owner: {"x": 5})
    reg = _registry(swap, prop)
    action, holder = Action(), Holder()
    reg.apply(swap, action)
    reg.apply(prop, holder)
    assert action() == "merging" and holder.x == 5
    reg.undo_all()
    assert type(action) is Action and action() == "plain" and holder.x == 1


def test_torch_buffers_are_restored_not_deleted():
    module = torch.nn.Module()
    module.register_buffer("table", torch.zeros(2), persistent=False)
    longer = Patch(name="Module.table", target="a module", why="test",
                   attrs=("table",), replace=lambda owner: {"table": torch.ones(4)})
    reg = _registry(longer)
    reg.apply(longer, module)
    assert module.table.shape == (4,) and "table" in module._buffers
    reg.undo(longer, module)
    assert torch.equal(module.table, torch.zeros(2)) and "table" in module._buffers


def test_mapping_items():
    env_patch = Patch(name="env.FLAG", target="env['FLAG']", why="test",
                      attrs=("FLAG",), replace=lambda env: {"FLAG": "0"},
                      items=True, adds=True)
    reg = _registry(env_patch)
    env = {}
    reg.apply(env_patch, env)
    assert env == {"FLAG": "0"}
    reg.undo(env_patch, env)
    assert env == {}
    env = {"FLAG": "1"}
    reg.apply(env_patch, env)
    reg.undo(env_patch, env)
    assert env == {"FLAG": "1"}


def test_undo_since_a_snapshot_undoes_only_what_came_after():
    big = Patch(name="Holder.cache", target="a holder", why="test",
                attrs=("cache",), replace=lambda owner: {"cache": 1},
                undoable=False)
    reg = _registry(GREET, MAKE, big)
    reg.apply(GREET, Base, "kept")
    before = reg.applied()
    holder = Child()
    holder.cache = 0
    reg.apply(MAKE, Base)
    reg.apply(GREET, Child, "new")
    reg.apply(big, holder)
    assert reg.undo_since(before) == [GREET, MAKE]  # latest first
    assert reg.applied() == [(GREET, Base), (big, holder)]
    assert Child().greet() == ("kept", "base") and Base.make(1) == 2
    reg.undo_all()


def test_a_patch_that_keeps_no_original_cannot_be_undone():
    big = Patch(name="Holder.cache", target="a holder", why="test",
                attrs=("cache",), replace=lambda owner: {"cache": torch.ones(3)},
                undoable=False)
    reg = _registry(big)
    holder = Child()
    holder.cache = torch.zeros(3)
    old = holder.cache
    reg.apply(big, holder)
    del old
    assert reg.is_applied(big, holder)
    with pytest.raises(PatchError, match="cannot be undone"):
        reg.undo(big, holder)
    reg.undo_all()
    assert reg.is_applied(big, holder) and torch.equal(holder.cache, torch.ones(3))
    with pytest.raises(PatchError, match="already patched"):
        reg.apply(big, holder)
