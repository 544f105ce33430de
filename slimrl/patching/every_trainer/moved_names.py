"""Names TRL moved, importable from both places while slimrl is patched.

* From ``trl`` again: Unsloth-era notebooks (written for TRL 0.x) write ``from trl import ORPOConfig, ORPOTrainer``,
  which TRL 1.x refuses before anything runs (the trainers live under ``trl.experimental``). Each moved name resolves
  to TRL's own class at its new place, with one ``FutureWarning`` naming that place. Declared once in :data:`MOVED`;
  a name the installed TRL has at the top level, or whose new module it lacks, is left as TRL has it.
* From ``trl.experimental`` again where TRL made an experimental trainer stable and then dropped the old module
  (TRL 1.18 made ``AsyncGRPOTrainer`` stable; ``trl.experimental.async_grpo`` warns until 2.0): :data:`PROMOTED`
  names the old module and its names; where the installed TRL no longer has that module (or ``trl.experimental``
  at all) but has the names at the top level, the old import resolves to them.

``unpatch()`` takes both away again.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

from slimrl.compat.runtime.swaps import restore, swap

# name -> its module under trl.experimental (TRL 1.12-1.16; PPO, BCO, XPO, Nash-MD, PRM only up to 1.12/1.13;
# AsyncGRPO until TRL 1.18 made it stable)
MOVED = {
    f"{prefix}{kind}": module
    for prefix, module in (
        ("ORPO", "orpo"),
        ("CPO", "cpo"),
        ("OnlineDPO", "online_dpo"),
        ("GKD", "gkd"),
        ("BCO", "bco"),
        ("XPO", "xpo"),
        ("NashMD", "nash_md"),
        ("PRM", "prm"),
        ("PPO", "ppo"),
        ("AsyncGRPO", "async_grpo"),
    )
    for kind in ("Config", "Trainer")
}
# experimental module -> the names it had, which a later TRL exports from `trl` itself
PROMOTED = {"trl.experimental.async_grpo": ("AsyncGRPOTrainer", "AsyncGRPOConfig")}

# "swapped": trl's class swap (slimrl.compat.runtime.swaps), "finder", "names": what was made importable
_STATE: dict = {}
_WARNED: set[str] = set()


def _exists(module: str) -> bool:
    """Whether the installed TRL has ``module`` (False also where a parent such as ``trl.experimental`` is gone)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental's import notice
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            return False


def _movable(trl) -> dict[str, str]:
    out = {}
    for name, module in MOVED.items():
        if name in dir(trl):
            continue  # this TRL still (or again) has it at the top level
        if _exists(f"trl.experimental.{module}"):
            out[name] = module
    return out


class _PromotedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old experimental modules of :data:`PROMOTED` (and their parent) that the installed TRL lacks."""

    def __init__(self, modules: dict[str, tuple[str, ...]]) -> None:
        self.modules = modules

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.modules or fullname == "trl.experimental" and any(self.modules):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        names = self.modules.get(module.__name__, ())
        if names:
            warnings.warn(
                f"{module.__name__} is gone from the installed TRL; its {', '.join(names)} are trl's own "
                f"now (import them from trl); slimrl makes the old import work",
                FutureWarning,
                stacklevel=2,
            )
        trl = importlib.import_module("trl")
        for name in names:
            setattr(module, name, getattr(trl, name))


def _promoted(trl) -> dict[str, tuple[str, ...]]:
    """The old modules of :data:`PROMOTED` the installed TRL lacks while it has their names at the top level."""
    return {m: names for m, names in PROMOTED.items() if not _exists(m) and all(n in dir(trl) for n in names)}


def install() -> list[str]:
    """Make the moved names of the installed TRL importable from ``trl`` (and promoted ones from their old
    module); the names."""
    if _STATE:
        return sorted(_STATE.get("names", ()))
    trl = sys.modules.get("trl") or importlib.import_module("trl")
    names, promoted = _movable(trl), _promoted(trl)
    if promoted:
        finder = _PromotedFinder(promoted)
        sys.meta_path.append(finder)  # last: TRL's own modules are found first wherever they exist
        _STATE["finder"] = finder
    if not names:
        return sorted(n for names_ in promoted.values() for n in names_)
    base = type(trl)

    class TrlWithMovedNames(base):
        """``trl`` as TRL 1.x has it, plus its moved names (slimrl.patching.every_trainer.moved_names)."""

        def __getattr__(self, name):
            where = names.get(name)
            if where is None:
                return (
                    base.__getattr__(self, name)
                    if hasattr(base, "__getattr__")
                    else object.__getattribute__(self, name)
                )
            if name not in _WARNED:
                _WARNED.add(name)
                warnings.warn(
                    f"trl.{name} is trl.experimental.{where}.{name} in the installed TRL; slimrl makes "
                    f"the old import work (import it from trl.experimental.{where})",
                    FutureWarning,
                    stacklevel=2,
                )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TRL's experimental-import notice: the warning above says it
                return getattr(importlib.import_module(f"trl.experimental.{where}"), name)

        def __dir__(self):
            return sorted(set(super().__dir__()) | set(names))

    _STATE.update(swapped=swap(trl, "__class__", TrlWithMovedNames), names=names)
    return sorted(names)


def uninstall() -> None:
    """``trl`` exactly as it was."""
    finder = _STATE.pop("finder", None)
    if finder is not None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for module in [*finder.modules, "trl.experimental"]:
            loaded = sys.modules.get(module)
            if (
                loaded is not None
                and isinstance(getattr(loaded, "__spec__", None), importlib.machinery.ModuleSpec)
                and loaded.__spec__.loader is finder
            ):
                del sys.modules[module]
    if "swapped" in _STATE:
        restore(_STATE["swapped"])
    _STATE.clear()


__all__ = ["MOVED", "PROMOTED", "install", "uninstall"]
