"""Every trainer the installed TRL ships, read from TRL's own modules when the patches load (never a hand-kept list).

TRL keeps its trainers in two places: the stable ones are public names of ``trl`` (``GRPOTrainer``,
``DistillationTrainer``, ...), the others live one per sub-package of ``trl.experimental`` (``trl.experimental.gkd``,
``trl.experimental.gmpo``, ...), and the set changes with every release (1.16 added A2PO, SDPO, IWOPD, ...; 1.13
removed BCO, XPO, PRM). :func:`shipped` walks both places and pairs each trainer class with the config class TRL
publishes beside it (``GKDTrainer`` with ``GKDConfig``); a sub-package that cannot be imported here (an optional
dependency missing) is skipped. What slimrl does with each one is decided by :mod:`slimrl.patching.derived`.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shipped:
    """One trainer class of the installed TRL, with the config class published beside it."""

    name: str  # PatchFastRL's name: the class name without "Trainer", snake_case ("AsyncGRPO" -> "async_grpo")
    trainer: str  # "module:Class", the module that defines it
    config: str | None  # "module:Class", or None where TRL publishes none beside it (it takes its base's config)
    public: str  # the module users import it from ("trl", "trl.experimental.gkd")


def snake_name(class_name: str) -> str:
    """``"AsyncGRPOTrainer"`` -> ``"async_grpo"``, ``"GRPOWithReplayBufferTrainer"`` -> ``"grpo_with_replay_buffer"``,
    ``"IWOPDTrainer"`` -> ``"iwopd"``, ``"A2POTrainer"`` -> ``"a2po"``: an underscore where a word starts (a lower-case
    letter then an upper-case one, or an acronym then a capitalised word); acronyms stay whole."""
    stem = class_name[: -len("Trainer")] if class_name.endswith("Trainer") else class_name
    return re.sub(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", stem).lower()


def _public_modules() -> list[str]:
    """``trl`` and each sub-package of ``trl.experimental`` (names only: nothing is imported here)."""
    names = ["trl"]
    try:
        experimental = importlib.import_module("trl.experimental")
    except ImportError:
        return names
    names += [f"trl.experimental.{m.name}" for m in pkgutil.iter_modules(experimental.__path__) if m.ispkg]
    return names


def _classes(module_name: str) -> dict[str, type]:
    """The public classes of one module (its ``__all__``, else its names); {} when it cannot be imported here."""
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001 (an optional dependency of one experimental trainer: the others still count)
        return {}
    out = {}
    for name in getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]:
        try:
            obj = getattr(module, name)
        except Exception:  # noqa: BLE001 (a lazy name whose import fails here)
            continue
        if isinstance(obj, type) and obj.__module__.startswith("trl."):
            out[name] = obj
    return out


@functools.lru_cache(maxsize=4)
def _shipped(version: str) -> tuple[Shipped, ...]:
    from transformers import Trainer, TrainingArguments

    found: dict[type, Shipped] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental's import notices
        for module_name in _public_modules():
            classes = _classes(module_name)
            for name, cls in classes.items():
                if not (issubclass(cls, Trainer) and name.endswith("Trainer")) or cls in found:
                    continue
                config = classes.get(name[: -len("Trainer")] + "Config")
                if config is not None and not issubclass(config, TrainingArguments):
                    config = None
                found[cls] = Shipped(
                    snake_name(name),
                    f"{cls.__module__}:{cls.__qualname__}",
                    f"{config.__module__}:{config.__qualname__}" if config else None,
                    module_name,
                )
    return tuple(found.values())


def shipped() -> tuple[Shipped, ...]:
    """Every trainer class the installed TRL publishes (stable ones first), each once."""
    from slimrl.compat.trl_info import trl_version

    return _shipped(str(trl_version()))


def resolve(target: str, quiet: bool = True) -> Any:
    """The object named by ``"module:Qualified.Name"`` (or ``"module"``: the module itself): the one way slimrl reads
    its targets (the registry's patches, the trainer table's classes, this catalog). ``quiet``: the module's import
    warnings hidden (TRL's deprecation notes while slimrl lists trainers); ImportError / AttributeError as raised."""
    module, _, name = target.partition(":")
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        obj = importlib.import_module(module)
    for part in filter(None, name.split(".")):
        obj = getattr(obj, part)
    return obj
