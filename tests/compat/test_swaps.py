"""slimrl.compat.runtime.swaps: a swap is undone exactly, whatever held the attribute before."""

from __future__ import annotations

import types

import pytest

from slimrl.compat.runtime.swaps import MISSING, restore, swap, swapped


class Base:
    def method(self):
        return "base"


class Child(Base):
    def own(self):
        return "child"


def test_an_inherited_method_leaves_no_copy_behind():
    done = swap(Child, "method", lambda self: "new")
    assert Child().method() == "new" and done.seen is Base.method and done.own is MISSING
    restore(done)
    assert "method" not in Child.__dict__ and Child().method() == "base"


def test_a_classs_own_entry_goes_back_as_it_was_stored():
    raw = Child.__dict__["own"]
    with swapped(Child, "own", staticmethod(lambda: "new")) as before:
        assert Child.own() == "new" and before is raw
    assert Child.__dict__["own"] is raw


def test_a_module_attribute_and_one_its_getattr_serves():
    module = types.ModuleType("planted")
    module.value = 1
    module.__getattr__ = lambda name: "served" if name == "lazy" else (_ for _ in ()).throw(AttributeError(name))
    with swapped(module, "value", 2), swapped(module, "lazy", "set"):
        assert (module.value, module.lazy) == (2, "set")
    assert module.value == 1 and "lazy" not in vars(module) and module.lazy == "served"


def test_a_modules_class_goes_back():
    module = types.ModuleType("planted")

    class Wider(types.ModuleType):
        extra = 3

    with swapped(module, "__class__", Wider):
        assert module.extra == 3
    assert type(module) is types.ModuleType


def test_restored_when_the_block_raises_and_never_adds_a_name():
    with pytest.raises(KeyError), swapped(Child, "method", lambda self: "new"):
        raise KeyError
    assert "method" not in Child.__dict__
    with pytest.raises(AttributeError):
        swap(Child, "absent", 1)
