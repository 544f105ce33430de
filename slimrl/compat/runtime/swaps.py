"""The one way slimrl replaces an attribute of someone else's class or module and puts it back.

:func:`swap` sets ``obj.attribute`` and returns a :class:`Swapped` record of what was there: the value ``getattr`` saw
(what a replacement delegates to) and the value in ``obj``'s own ``__dict__``, or "nothing" where a class only inherited
it (or a module's ``__getattr__`` served it), so :func:`restore` leaves ``obj`` exactly as it was (no copy of an
inherited method left behind). The patch registry (:mod:`slimrl.patching.machinery.registry`) installs every TRL patch
through it; layers below the registry (``generation``'s CPU LoRA ops), ``moved_names``' class swap on ``trl`` and
``verify``'s temporary swaps use it directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

MISSING: Any = object()  # "the class had no such entry of its own"
_LIVE: list = []  # the swaps in place now, oldest first (seen_before)


@dataclass(frozen=True)
class Swapped:
    """``obj.attribute`` replaced: ``seen`` is what ``getattr`` returned before, ``own`` what ``restore`` puts back
    (:data:`MISSING`: delete the entry so the inherited or served one shows again)."""

    obj: Any
    attribute: str
    seen: Any
    own: Any


def swap(obj: Any, attribute: str, new: Any) -> Swapped:
    """Set ``obj.attribute = new``; the record to :func:`restore` it. ``AttributeError`` where ``obj`` has no such
    attribute (a swap never adds a name)."""
    seen = getattr(obj, attribute)
    # an entry of obj's own __dict__, else nothing: inherited (a class's method) or served by a module's __getattr__;
    # __class__ lives in no __dict__ and goes back as seen
    own = seen if attribute == "__class__" or not hasattr(obj, "__dict__") else obj.__dict__.get(attribute, MISSING)
    setattr(obj, attribute, new)
    done = Swapped(obj, attribute, seen, own)
    _LIVE.append(done)
    return done


def restore(done: Swapped) -> None:
    """Put back exactly what :func:`swap` replaced."""
    _LIVE[:] = [d for d in _LIVE if d is not done]
    if done.own is MISSING:
        delattr(done.obj, done.attribute)
    else:
        setattr(done.obj, done.attribute, done.own)


@contextmanager
def swapped(obj: Any, attribute: str, new: Any) -> Iterator[Any]:
    """``obj.attribute`` is ``new`` inside the block; yields the value it replaced."""
    done = swap(obj, attribute, new)
    try:
        yield done.seen
    finally:
        restore(done)


def seen_before(obj: Any, attribute: str, default: Any) -> Any:
    """What ``obj.attribute`` was before the oldest swap in place replaced it; ``default`` where none did (what
    slimrl's own replacements are looked through to)."""
    for done in _LIVE:
        if done.obj is obj and done.attribute == attribute:
            return done.seen
    return default
