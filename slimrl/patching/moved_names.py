"""Names TRL moved from ``trl`` to ``trl.experimental`` in its 1.x releases, importable from ``trl`` again while slimrl
is patched: Unsloth-era notebooks (written for TRL 0.x) write ``from trl import ORPOConfig, ORPOTrainer``, which
TRL 1.x refuses before anything runs. Each moved name resolves to TRL's own class at its new place, with one
``FutureWarning`` naming that place; ``unpatch()`` takes the names away again. Declared once in :data:`MOVED`;
a name the installed TRL has at the top level, or whose new module it lacks, is left as TRL has it."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

# name -> its module under trl.experimental (TRL 1.12-1.16; PPO, BCO, XPO, Nash-MD, PRM only up to 1.12/1.13)
MOVED = {f"{prefix}{kind}": module for prefix, module in (
    ("ORPO", "orpo"), ("CPO", "cpo"), ("OnlineDPO", "online_dpo"), ("GKD", "gkd"), ("BCO", "bco"), ("XPO", "xpo"),
    ("NashMD", "nash_md"), ("PRM", "prm"), ("PPO", "ppo")) for kind in ("Config", "Trainer")}

_STATE: dict = {}  # "module": the trl module, "cls": its class before, "names": what was made importable
_WARNED: set[str] = set()


def _movable(trl) -> dict[str, str]:
    out = {}
    for name, module in MOVED.items():
        if name in dir(trl):
            continue  # this TRL still has it at the top level
        if importlib.util.find_spec(f"trl.experimental.{module}") is not None:
            out[name] = module
    return out


def install() -> list[str]:
    """Make the moved names of the installed TRL importable from ``trl``; the names."""
    if _STATE:
        return sorted(_STATE["names"])
    trl = sys.modules.get("trl") or importlib.import_module("trl")
    names = _movable(trl)
    if not names:
        return []
    base = type(trl)

    class TrlWithMovedNames(base):
        """``trl`` as TRL 1.x has it, plus its moved names (slimrl.patching.moved_names)."""

        def __getattr__(self, name):
            where = names.get(name)
            if where is None:
                return base.__getattr__(self, name) if hasattr(base, "__getattr__") else \
                    object.__getattribute__(self, name)
            if name not in _WARNED:
                _WARNED.add(name)
                warnings.warn(f"trl.{name} is trl.experimental.{where}.{name} in TRL 1.x; slimrl makes the old "
                              f"import work (import it from trl.experimental.{where})", FutureWarning, stacklevel=2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TRL's experimental-import notice: the warning above says it
                return getattr(importlib.import_module(f"trl.experimental.{where}"), name)

        def __dir__(self):
            return sorted(set(super().__dir__()) | set(names))

    _STATE.update(module=trl, cls=base, names=names)
    trl.__class__ = TrlWithMovedNames
    return sorted(names)


def uninstall() -> None:
    """``trl`` exactly as it was."""
    if _STATE:
        _STATE["module"].__class__ = _STATE["cls"]
        _STATE.clear()
