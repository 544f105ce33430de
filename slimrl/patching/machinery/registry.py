"""One registry for every patch slimrl makes to TRL.

A :class:`Patch` names a target (a class or module, found by import path so the registry is declared without
importing TRL), the attribute it replaces, and the replacement. ``install`` swaps the attribute on the live object
(:func:`slimrl.compat.runtime.swaps.swap`: ``from trl import GRPOTrainer`` done before or after gets the patched class)
and keeps the original for delegation and for ``uninstall``, which puts back exactly what was there (including
"nothing" for an attribute that the class only inherited). TRL's source text is never read or rewritten. A callable
replacement is installed behind its contract (:mod:`slimrl.patching.machinery.contracts`): a call it was not written
for (an argument a newer TRL added) goes to TRL's original unchanged, with one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slimrl.compat.runtime.swaps import Swapped, restore, swap
from slimrl.compat.trl_info import EVERY_RELEASE
from slimrl.patching.machinery.contracts import guard

_MISSING = object()


class PatchTargetMissingError(AttributeError):
    """A patch applies to the installed TRL release but its target is not there (TRL renamed or removed it)."""


@dataclass(frozen=True)
class Patch:
    """Replace ``<target>.<attribute>`` with ``replacement``.

    ``target`` is ``"module.path:Qualified.Name"`` (a class) or ``"module.path"`` (a module attribute).
    ``algorithm`` is one name, or a tuple of names for a patch several trainers share (installed while any of them
    is patched). ``versions``: the TRL releases the patch applies to (PEP 440 specifier); on others it is skipped.
    ``wrap``: when true, ``replacement`` is a factory ``f(original) -> new attribute``.
    """

    algorithm: str | tuple[str, ...]
    target: str
    attribute: str
    replacement: Callable[..., Any]
    versions: str = EVERY_RELEASE
    wrap: bool = False
    optional: bool = field(default=False)  # skip when the attribute does not exist in this TRL (VLLMGeneration)
    # the contract (slimrl.patching.machinery.contracts): the member calls reach on a class-valued replacement (the
    # kernel's "apply"); parameters of later TRL releases served at one value ((name, value), ...); entry points
    # (constructors) pass every argument on to TRL's original themselves and have none
    member: str | None = None
    later: tuple[tuple[str, Any], ...] = ()
    entry: bool = False
    # a wrap that hands every argument to TRL's original as it came (push_to_hub, training_step, prediction_step):
    # it re-implements nothing, so no contract; a changed signature of its target (TRL's or transformers') is TRL's own
    passthrough: bool = False

    def resolve(self) -> Any:
        """The live object named by ``target``; :class:`PatchTargetMissingError` naming the TRL release when the
        module or class is not there."""
        from slimrl.patching.machinery.catalog import resolve

        try:
            return resolve(self.target, quiet=False)
        except (ImportError, AttributeError) as err:
            raise PatchTargetMissingError(self._missing(f"{self.target} does not exist ({err})")) from None

    def target_exists(self) -> bool:
        """Whether ``target`` and its ``attribute`` exist in the installed TRL."""
        try:
            return hasattr(self.resolve(), self.attribute)
        except PatchTargetMissingError:
            return False

    def _missing(self, what: str) -> str:
        from slimrl.compat.trl_info import SUPPORTED_TRL, trl_version

        return (
            f"slimrl cannot patch {self.target}.{self.attribute}: {what} in the installed trl {trl_version()}, "
            f"although the patch is declared for trl{self.versions}. The installed TRL changed this method; "
            f"install a tested release (pip install 'trl{SUPPORTED_TRL}') or report it to slimrl"
        )

    @property
    def algorithms(self) -> tuple[str, ...]:
        return (self.algorithm,) if isinstance(self.algorithm, str) else tuple(self.algorithm)

    def applies(self) -> bool:
        """Whether the installed TRL is one of ``versions``."""
        from packaging.specifiers import SpecifierSet

        from slimrl.compat.trl_info import trl_version

        return SpecifierSet(self.versions).contains(trl_version(), prereleases=True)

    @property
    def key(self) -> tuple[str, str]:
        return (self.target, self.attribute)

    @property
    def guarded(self) -> bool:
        """Whether calls reach the replacement through its contract: every callable replacement but an entry
        point's (a constructor, a replaced class without a ``member``) and a pass-through wrap's."""
        return not (
            self.entry
            or self.passthrough
            or self.attribute == "__init__"
            or self.attribute.startswith("__")
            or (isinstance(self.replacement, type) and self.member is None and not self.wrap)
        )


_REGISTRY: list[Patch] = []
_INSTALLED: dict[tuple[str, str], Swapped] = {}  # key -> what install replaced (slimrl.compat.runtime.swaps)
_LOADERS: list = []  # what registers the declared patches, run at the registry's first use (not at import)


def on_first_use(loader) -> None:
    """``loader()`` registers the declared patches the first time the registry is asked for them (listed, installed
    or described), so importing slimrl registers nothing."""
    _LOADERS.append(loader)


def _load() -> None:
    while _LOADERS:
        _LOADERS.pop(0)()


def register(patch: Patch) -> Patch:
    """Declare a patch (called by the patch table's loader, :func:`on_first_use`)."""
    if any(p.key == patch.key for p in _REGISTRY):
        raise ValueError(f"two patches for {patch.target}.{patch.attribute}")
    _REGISTRY.append(patch)
    return patch


def patches(algorithm: str | None = None) -> list[Patch]:
    _load()
    return [p for p in _REGISTRY if algorithm is None or algorithm in p.algorithms]


def original(target: str, attribute: str) -> Any:
    """The attribute as it was before slimrl patched it (what the replacement delegates to)."""
    try:
        return _INSTALLED[(target, attribute)].seen
    except KeyError:
        raise RuntimeError(f"{target}.{attribute} is not patched; call PatchFastRL first") from None


def is_installed(patch: Patch) -> bool:
    return patch.key in _INSTALLED


def install(patch: Patch) -> bool:
    """Install one patch; idempotent. Returns False (nothing done) on a TRL outside ``patch.versions`` and for an
    optional patch whose attribute is absent; raises :class:`PatchTargetMissingError` for a patch that applies to
    this TRL but whose target is not there (never a silent no-op)."""
    if patch.key in _INSTALLED:
        return True
    if not patch.applies():
        return False
    obj = patch.resolve()
    seen = getattr(obj, patch.attribute, _MISSING)
    if seen is _MISSING and patch.optional:
        return False
    if seen is _MISSING:
        raise PatchTargetMissingError(patch._missing(f"{patch.attribute} is not an attribute of {patch.target}"))
    new = patch.replacement(seen) if patch.wrap else patch.replacement
    if patch.guarded:  # calls it was not written for go to `seen` (slimrl.patching.machinery.contracts)
        new = guard(f"{patch.target}.{patch.attribute}", new, seen, patch.member, patch.later)
    _INSTALLED[patch.key] = swap(obj, patch.attribute, new)
    return True


def uninstall(patch: Patch) -> None:
    """Put back exactly what was there before :func:`install`."""
    done = _INSTALLED.pop(patch.key, None)
    if done is not None:
        restore(done)


def describe() -> list[dict[str, str]]:
    """One row per declared patch: algorithm, target, attribute, replacement, TRL versions, installed."""
    _load()
    return [
        {
            "algorithm": ",".join(p.algorithms),
            "target": p.target,
            "attribute": p.attribute,
            "replacement": getattr(getattr(p.replacement, "func", p.replacement), "__qualname__", repr(p.replacement)),
            "trl": p.versions,
            "installed": "yes" if p.key in _INSTALLED else "no",
        }
        for p in _REGISTRY
    ]
