"""What a TRL method slimrl replaces depends on beyond its own lines, and whether the code Python runs is its source.

* :func:`reached`: the TRL functions it calls by name — module globals (``selective_log_softmax``), methods on its
  class (``self._get_high_entropy_mask``) — and, in turn, the ones those call (two levels): a fork that edits a
  helper the replaced method calls changes the numbers as much as an edit of the method itself. slimrl's own
  replacements are looked through to TRL's original (:func:`slimrl.compat.runtime.swaps.seen_before`).
* :func:`bindings`: the module-global names among those, with the object each names now, so a helper rebound after
  ``PatchFastRL`` (which TRL alone would follow) is seen (:func:`rebound`).
* :func:`runs_its_source`: the function's code object equals what its source text compiles to on this Python: a
  ``.pyc`` that differs from its ``.py`` (an edit without a recompile, a stale or planted cache) does not.
* :func:`is_users_code`: a function that is not from TRL or transformers (a user's wrapper installed before
  ``PatchFastRL``).
"""

from __future__ import annotations
import __future__

import functools
import importlib.util
import inspect
import os
import types
from typing import Any

from slimrl.compat.runtime.swaps import seen_before

DEPTH = 2  # levels of helpers followed below a replaced method


def function_of(obj: Any) -> types.FunctionType | None:
    """The Python function behind ``obj`` (a method, static or class method), else None (a class, a builtin)."""
    obj = getattr(obj, "__func__", obj)
    return obj if isinstance(obj, types.FunctionType) else None


@functools.cache
def package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(next(iter(spec.submodule_search_locations))) + os.sep


def from_package(fn: types.FunctionType, *names: str) -> bool:
    """Whether ``fn``'s code lives in one of the packages ``names`` (an editable install's folder counts)."""
    path = os.path.realpath(fn.__code__.co_filename)
    return any(d is not None and path.startswith(d) for d in map(package_dir, names))


def is_users_code(value: Any) -> bool:
    """A function not defined in TRL, transformers or slimrl (``functools.wraps`` copies names, not code: a wrapper
    shows)."""
    fn = function_of(value)
    return fn is not None and not from_package(fn, "trl", "transformers", "slimrl")


def _names(code: types.CodeType) -> set[str]:
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def owner_value(owner: type, name: str) -> Any:
    """``owner.name`` as TRL has it (slimrl's replacement looked through), from the class that defines it."""
    for klass in owner.__mro__:
        if name in klass.__dict__:
            return seen_before(klass, name, klass.__dict__[name])
    return None


def _values(current: types.FunctionType, owner: type | None) -> list[Any]:
    """What ``current`` can call: the objects its names hold (module globals, ``owner``'s attributes), the function
    a decorator wraps (``__wrapped__``) and the functions its closure holds (TRL's ``profiling_decorator``)."""
    module = inspect.getmodule(current)
    out: list[Any] = [getattr(current, "__wrapped__", None)]
    for cell in current.__closure__ or ():
        try:
            out.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    for name in sorted(_names(current.__code__)):
        value = current.__globals__.get(name)
        out.append(seen_before(module, name, value) if module is not None else value)
        if owner is not None:
            out.append(owner_value(owner, name))
    return out


def reached(fn: types.FunctionType, owner: type | None = None) -> dict[str, types.FunctionType]:
    """``"module:qualname" -> function`` of the TRL functions ``fn`` reaches by name, :data:`DEPTH` levels down
    (module docstring); ``owner``: the class whose attributes ``self.<name>`` resolve on."""
    found: dict[str, types.FunctionType] = {}
    level = [fn]
    for _ in range(DEPTH):
        below = []
        for current in level:
            for value in _values(current, owner):
                callee = function_of(value)
                if callee is None or callee is fn or not from_package(callee, "trl"):
                    continue
                label = f"{callee.__module__}:{callee.__qualname__}@{callee.__code__.co_firstlineno}"
                if label not in found:
                    found[label] = callee
                    below.append(callee)
        level = below
    return found


def bindings(fn: types.FunctionType) -> list[tuple[dict, str, Any]]:
    """``(module globals, name, TRL function)`` for each module global ``fn``, or a TRL function it reaches, calls:
    what a rebinding after ``PatchFastRL`` changes (slimrl's own patches looked through)."""
    import sys

    out = []
    for current in [fn, *reached(fn).values()]:
        module = sys.modules.get(current.__globals__.get("__name__", ""))
        for name in sorted(_names(current.__code__)):
            value = current.__globals__.get(name)
            value = seen_before(module, name, value) if module is not None else value
            callee = function_of(value)
            if callee is not None and from_package(callee, "trl"):
                out.append((current.__globals__, name, value))
    return out


def rebound(seen: list[tuple[dict, str, Any]]) -> str | None:
    """The first of ``seen`` (from :func:`bindings`) whose name now holds another object than TRL's function and
    than slimrl's own replacement of it, as ``module.name``."""
    import sys

    for globs, name, value in seen:
        now = globs.get(name, value)
        if now is value:
            continue
        module = sys.modules.get(globs.get("__name__", ""))
        if module is None or seen_before(module, name, now) is not value:
            return f"{globs.get('__name__', '?')}.{name}"
    return None


def _future_flags(fn: types.FunctionType) -> int:
    flags = 0
    for feature in __future__.all_feature_names:
        if isinstance(fn.__globals__.get(feature), __future__._Feature):
            flags |= getattr(__future__, feature).compiler_flag
    return flags


def _same(a: types.CodeType, b: types.CodeType) -> bool:
    if (a.co_code, a.co_names, a.co_varnames, a.co_freevars, a.co_cellvars, a.co_exceptiontable) != (
        b.co_code,
        b.co_names,
        b.co_varnames,
        b.co_freevars,
        b.co_cellvars,
        b.co_exceptiontable,
    ):
        return False
    if len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts, strict=True):
        if isinstance(x, types.CodeType) and isinstance(y, types.CodeType):
            if not _same(x, y):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _find(code: types.CodeType, name: str, line: int) -> types.CodeType | None:
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            if const.co_name == name and const.co_firstlineno == line:
                return const
            inner = _find(const, name, line)
            if inner is not None:
                return inner
    return None


@functools.lru_cache(maxsize=64)
def _compiled(filename: str, source: str, flags: int) -> types.CodeType | None:
    """The module's source compiled whole: the compiler's choices depend on the module (an imported name's
    attribute is loaded as an attribute, not a method)."""
    try:
        return compile(source, filename, "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        return None


def runs_its_source(fn: types.FunctionType) -> bool:
    """Whether ``fn``'s code object is what its module's source file compiles to (module docstring); False when
    the source cannot be read."""
    code = fn.__code__
    try:
        with open(code.co_filename, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError):
        return False
    compiled = _compiled(code.co_filename, source, _future_flags(fn))
    found = _find(compiled, code.co_name, code.co_firstlineno) if compiled is not None else None
    return found is not None and _same(found, code)
