"""What each replacement was written for, and TRL's original for every other call.

A replacement of a TRL method or kernel serves the calls whose arguments TRL's tested releases pass; a TRL release
newer than slimrl's tests may pass more (TRL 1.17 gave its fused-head kernel a tenth argument, ``support_ids``).
The registry (:func:`slimrl.patching.machinery.registry.install`) puts every callable replacement behind :func:`guard`:

* the call is bound to the **recorded contract**: the signature of the original in the tested TRL release it
  matches (``contracts.json`` beside this module, written by ``python -m slimrl.patching --record-contracts`` in
  each tested release's environment; a test fails when the installed release's signatures are not recorded), or
  the newest recorded one when the installed TRL's signature matches none;
* plus the parameters of later releases a patch declares it serves at one value (``Patch.later``, e.g. the
  kernel's ``support_ids=None``: a call without a kept set is the call it was written for);
* a call that does not bind (an extra positional argument, an unknown keyword), that passes a later parameter
  at another value, or that comes after a TRL helper the original calls by a module-global name was rebound
  (``trl.trainer.grpo_trainer.selective_log_softmax = mine``: TRL alone follows it;
  :func:`slimrl.patching.machinery.reach.rebound`) goes to TRL's original unchanged — TRL's own result — and a
  :class:`HandedBackWarning` names the patch and the argument, once per process and reason.

Constructors (``__init__`` of TRL's trainers and configs, classes such as ``VLLMGeneration``) are entry points:
their replacements translate the user's legacy keywords and pass every other argument to TRL's original, so no
contract gates them. Attributes that are not callables (dataclass field tables, attention registries) have none.

:func:`signature_changes` lists the installed targets whose signature matches no recorded one: the self-check
(:mod:`slimrl.patching.every_trainer.preflight`) runs for their trainers.
"""

from __future__ import annotations

import functools
import inspect
import types
from pathlib import Path
from typing import Any

from slimrl.compat.runtime.callsite import warn
from slimrl.patching.machinery import reach, release_records

RECORD = Path(__file__).with_name("contracts.json")
_EMPTY = inspect.Parameter.empty
_PLAIN = (type(None), bool, int, float, str)
_NOTED: set[tuple[str, str]] = set()
LATER_SEEN: set[str] = set()  # later parameters TRL passed at another value (e.g. a kept set: TRL >= 1.17's IS)


class HandedBackWarning(UserWarning):
    """A call slimrl's replacement was not written for went to TRL's original."""


def callable_of(value: Any, member: str | None) -> Any:
    """What a call reaches: ``value`` itself, or its ``member`` (the kernel's ``apply``); for a
    ``torch.autograd.Function`` (whose ``apply`` takes ``*args``) its ``forward`` without ``ctx``."""
    if value is None:
        return None
    if member is None:
        return value
    fn = getattr(value, member, None)
    forward = getattr(value, "forward", None)
    if member == "apply" and forward is not None and _takes_only_varargs(fn):
        return functools.partial(forward, None)  # forward(ctx, ...): the signature apply's callers use
    return fn


def _takes_only_varargs(fn: Any) -> bool:
    try:
        kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
    except (TypeError, ValueError):
        return True
    return kinds <= {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}


def shape_of(fn: Any) -> list[list] | None:
    """A signature as JSON: ``[name, kind, default]`` per parameter (default: its repr when it is a plain constant,
    ``"<object>"`` otherwise, absent when the parameter has none); None when ``fn`` has no signature."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        row: list = [p.name, p.kind.name]
        if p.default is not _EMPTY:
            plain = isinstance(p.default, _PLAIN) or (
                isinstance(p.default, tuple) and all(isinstance(x, _PLAIN) for x in p.default)
            )
            row.append(repr(p.default) if plain else "<object>")
        out.append(row)
    return out


def _signature(shape: list[list], later: tuple[tuple[str, Any], ...] = ()) -> inspect.Signature:
    """A signature to bind calls to: the recorded parameters (a placeholder default where one was), then the later
    parameters (before ``**kwargs``; keyword-only after ``*args``)."""
    params = [
        inspect.Parameter(name, getattr(inspect.Parameter, kind), default=None if rest else _EMPTY)
        for name, kind, *rest in shape
    ]
    names = {p.name for p in params}
    tail = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    star = any(p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.KEYWORD_ONLY) for p in params)
    kind = inspect.Parameter.KEYWORD_ONLY if star else inspect.Parameter.POSITIONAL_OR_KEYWORD
    params += [inspect.Parameter(name, kind, default=value) for name, value in later if name not in names]
    return inspect.Signature(params + tail)


@functools.lru_cache(maxsize=1)
def recorded() -> dict[str, list[dict]]:
    """``"target.attribute" -> [{"releases": [...], "params": shape}, ...]`` (contracts.json)."""
    return release_records.read(RECORD)


def contract_for(key: str, live: list[list] | None) -> tuple[list[list] | None, bool]:
    """(the recorded shape calls are bound to, whether the installed TRL's signature is one of the recorded)."""
    entries = recorded().get(key, [])
    for entry in entries:
        if entry["params"] == live:
            return live, True
    newest = max(entries, key=lambda e: max(_version(r) for r in e["releases"]), default=None)
    return (newest["params"] if newest else live), False


def _version(text: str):
    from packaging.version import Version

    return Version(text)


def refusal(bound: inspect.Signature, later: tuple[tuple[str, Any], ...], args: tuple, kwargs: dict) -> str | None:
    """Why a call is not one the replacement was written for (None: it is): the argument, named."""
    try:
        arguments = bound.bind(*args, **kwargs).arguments
    except TypeError as err:
        positional = sum(1 for p in bound.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        if len(args) > positional and not any(p.kind is p.VAR_POSITIONAL for p in bound.parameters.values()):
            return f"positional argument {positional + 1} (of {len(args)}), which its contract does not have"
        unknown = [k for k in kwargs if k not in bound.parameters]
        return f"keyword argument {unknown[0]!r}, which its contract does not have" if unknown else str(err)
    for name, neutral in later:
        value = arguments.get(name, neutral)
        if not (value is neutral or (neutral is None and value is None)):
            LATER_SEEN.add(name)
            return f"{name}={_short(value)} (a parameter of a later TRL release, served only as {name}={neutral!r})"
    return None


def _short(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"<{type(value).__name__} {tuple(shape)}>" if shape is not None else repr(value)[:40]


def note(key: str, reason: str) -> None:
    """The one line for a handed-back call (once per process and reason)."""
    if (key, reason) in _NOTED:
        return
    _NOTED.add((key, reason))
    cause = reason if " rebound " in reason else f"the installed trl passes {reason}"
    warn(
        f"slimrl handed a call of {key} back to TRL's original: {cause}; TRL computes this call exactly as "
        f"without slimrl (report it to slimrl to have it served)",
        HandedBackWarning,
    )


def guard(key: str, new: Any, seen: Any, member: str | None, later: tuple[tuple[str, Any], ...]) -> Any:
    """``new`` behind its contract (module docstring): calls it was written for reach it, the others ``seen``."""
    target = callable_of(new, member)
    if not isinstance(target, types.FunctionType | staticmethod) or seen is None:
        return new
    shape, _ = contract_for(key, shape_of(callable_of(seen, member)))
    if shape is None:
        return new
    bound = _signature(shape, later)
    original = getattr(seen, member) if member else seen

    names = list(bound.parameters)
    first_later = min((names.index(name) for name, _ in later if name in names), default=None)
    original_fn = reach.function_of(callable_of(seen, member))
    helpers = reach.bindings(original_fn) if original_fn is not None else []

    @functools.wraps(target)
    def contract_guard(*args, **kwargs):
        moved = reach.rebound(helpers) if helpers else None
        if moved is not None:  # TRL alone follows a rebound helper; slimrl's path would not
            note(key, f"{moved} rebound after PatchFastRL (TRL's code follows it)")
            return original(*args, **kwargs)
        reason = refusal(bound, later, args, kwargs)
        if reason is not None:
            note(key, reason)
            return original(*args, **kwargs)
        if first_later is not None:  # later parameters at their served value: the call as written for
            args = args[:first_later]
            kwargs = {k: v for k, v in kwargs.items() if all(k != name for name, _ in later)}
        return target(*args, **kwargs)

    contract_guard.__slimrl_contract__ = key
    if member is None:
        return contract_guard
    return type(
        new.__name__,
        (new,),
        {
            member: staticmethod(contract_guard),
            "__qualname__": new.__qualname__,
            "__module__": new.__module__,
            "__doc__": new.__doc__,
        },
    )


def _live_shapes(patches):
    """``(patch, "target.attribute", shape)`` of each guarded patch of the installed TRL whose target has a
    signature (the live one, as :func:`shape_of` writes it)."""
    for p in patches:
        if not p.applies() or not p.guarded:
            continue
        try:  # PatchTargetMissingError is an AttributeError: a target this TRL lacks has no signature
            live = shape_of(callable_of(getattr(p.resolve(), p.attribute, None), p.member))
        except AttributeError:
            continue
        if live is not None:
            yield p, f"{p.target}.{p.attribute}", live


def signature_changes(patches) -> dict[str, str]:
    """``"target.attribute" -> algorithm names`` for the installed targets whose signature matches no recorded
    one (a TRL release whose method changed since slimrl's tests)."""
    return {
        key: ",".join(p.algorithms)
        for p, key, live in _live_shapes(patches)
        if key in recorded() and not contract_for(key, live)[1]
    }


def record(patches, release: str) -> dict[str, list[dict]]:
    """contracts.json with the installed release's signatures of ``patches``' guarded targets added."""
    data = release_records.read(RECORD)
    for _, key, live in _live_shapes(patches):
        release_records.add_release(data, key, "params", live, release)
    return dict(sorted(data.items()))


def write(data: dict[str, list[dict]]) -> None:
    """contracts.json, one target per line (reviewable diffs when a TRL release is added)."""
    release_records.write(RECORD, data)
