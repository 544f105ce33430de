"""``PatchFastRL`` / ``unpatch``: install or remove slimrl's patches on TRL's trainer classes, in place; Unsloth's
other entry points (``PatchDPOTrainer``) and the patch on first use of ``slimrl.FastLanguageModel``
(:func:`patch_on_first_use`)."""

from __future__ import annotations

import sys
import warnings

from slimrl.compat.runtime.callsite import install_one_line_errors, warn
from slimrl.compat.runtime.env import env_flag
from slimrl.compat.runtime.malloc import cpu_training, tune_malloc
from slimrl.compat.trl_info import check_trl_supported
from slimrl.patching.every_trainer import moved_names, preflight
from slimrl.patching.every_trainer.defaults import set_strict
from slimrl.patching.machinery.registry import describe, install, on_first_use, patches, uninstall
from slimrl.patching.table import TRAINERS, TrainerSpec, every_trainer, register_all


def _load_patches() -> None:
    """The first use of the patches (not the import): the TRL release checked (a message when it is outside the
    supported range) and the table's patches registered."""
    check_trl_supported()
    register_all()


on_first_use(_load_patches)

# Algorithms patched now: a patch several trainers share stays until the last of them is unpatched.
_ACTIVE: set[str] = set()
# Trainers whose self-check row failed on this (untested) TRL: left to TRL alone for the whole process
_STOOD_DOWN: dict[str, str] = {}
_NOTED_REMOVED: set[str] = set()


class TrainerNotAvailableError(ImportError):
    """The installed TRL release does not ship the requested trainer."""


def _normalise(algorithm: str) -> str:
    """PatchFastRL's name for ``algorithm`` ("GRPOTrainer", "online-dpo", "iw_opd" and "IWOPD" are all accepted)."""
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a string or None, got {type(algorithm).__name__}")
    name = algorithm.strip().lower().replace("-", "_")
    if name.endswith("trainer"):
        name = name[: -len("trainer")].rstrip("_")
    if name in TRAINERS:  # the table's names need no look at the installed TRL's other trainers
        return name
    every = every_trainer()
    found = next((n for n in every if n.replace("_", "") == name.replace("_", "")), None)
    if found is None:
        raise ValueError(f"unknown algorithm {algorithm!r}; valid names: {', '.join(every)} (or None for all)")
    return found


def trainer_available(name: str) -> bool:
    """Whether the installed TRL ships the trainer for ``name``."""
    return every_trainer()[name].available()


def trainer_and_config(name: str) -> tuple[type, type]:
    """The installed TRL's (trainer class, config class) for ``name`` (e.g. ``"orpo"`` -> ``ORPOTrainer``,
    ``ORPOConfig`` from ``trl.experimental.orpo``); :class:`TrainerNotAvailableError` when TRL lacks it."""
    name = _normalise(name)
    _require(name)
    return every_trainer()[name].classes()


def _require(name: str) -> None:
    if trainer_available(name):
        return
    raise TrainerNotAvailableError(_removed_line(name))


def _removed_line(name: str) -> str:
    """One line: which TRL release removed ``name``'s trainer, what to use instead, and the release to pin."""
    from slimrl.compat.trl_info import TESTED_TRL, trl_version

    spec = every_trainer()[name]
    last = spec.last_release or TESTED_TRL[-1]  # removed after slimrl's tests: the newest tested release has it
    when = f"TRL removed it after {last}" + ("" if spec.last_release else " (the newest release slimrl tests)")
    instead = f"use {spec.instead}, or " if spec.instead else ""
    return (
        f"{spec.trainer_class_name} is not in the installed trl {trl_version()}: {when}; {instead}pin "
        f"pip install 'trl=={last}'"
    )


def _removed_since_tests() -> list[str]:
    """Trainers every tested release has that the installed TRL lacks (removed after slimrl's tests)."""
    return [n for n, spec in TRAINERS.items() if spec.last_release is None and not trainer_available(n)]


def PatchFastRL(
    algorithm: str | None = None,
    FastLanguageModel: object | None = None,  # noqa: N802, N803
    strict: bool = False,
) -> None:
    """Patch TRL's trainer classes in place so they train through slimrl's memory-lean paths.

    ``algorithm``: one of ``grpo, dpo, kto, orpo, cpo, sft, reward, rloo, online_dpo, ppo, bco, xpo, prm`` or the
    name of any other trainer the installed TRL ships, stable or experimental (``gkd``, ``gmpo``, ``tpo``,
    ``async_grpo``, ``distillation``, ...: its class name without "Trainer"; case-insensitive, ``"GKDTrainer"`` also
    works), or None for every trainer the installed TRL has. The others get slimrl's first-contact layer, or the
    route of the table trainer they subclass where they keep it (:mod:`slimrl.patching.derived`).
    Idempotent; :func:`unpatch` restores TRL exactly. ``FastLanguageModel`` is accepted for compatibility with
    Unsloth's call ``PatchFastRL("grpo", FastLanguageModel)`` and not needed.

    Raises ValueError for an unknown name and :class:`TrainerNotAvailableError` for a trainer the installed TRL
    lacks (one line: the release that removed it, what to use instead, the release to pin; with ``algorithm=None``
    the same line is a warning and the other trainers are patched). A trainer one of whose replaced TRL methods is
    gone (a TRL release newer than slimrl's tests renamed it) is left unpatched, never half patched, and named in
    one warning. On a TRL newer than slimrl's tests, each trainer's tiny parity row runs first and only trainers
    whose row passes are patched (:mod:`slimrl.patching.every_trainer.preflight`); a call a replacement was not written
    for goes to TRL's original (:mod:`slimrl.patching.machinery.contracts`). ``strict=True`` (or ``SLIMRL_STRICT=1``)
    keeps TRL's refusals of settings this machine cannot run
    instead of changing them to the nearest that runs (:mod:`slimrl.patching.every_trainer.defaults`). Without CUDA,
    glibc's malloc is also
    tuned to return large freed blocks to the OS (:mod:`slimrl.compat.runtime.malloc`; ``SLIMRL_MALLOC_TUNING=0`` turns
    it off).
    """
    install_one_line_errors()  # slimrl's refusals print as one line at the user's line from here on
    moved_names.install()  # `from trl import ORPOConfig` and TRL's other moved names work again
    names = [n for n in every_trainer() if trainer_available(n)] if algorithm is None else [_normalise(algorithm)]
    if algorithm is None:
        for gone in set(_removed_since_tests()) - _NOTED_REMOVED:  # the others are patched
            _NOTED_REMOVED.add(gone)
            warn(_removed_line(gone) + "; the other trainers are patched", UserWarning)
    for name in names:
        _require(name)
    set_strict(strict)
    refused = {name: gone for name in names if (gone := _missing_targets(name))}
    if refused:  # those run as TRL alone: never half patched, never stopped
        warn(_refusal(refused) + ("; the other trainers are patched" if algorithm is None else ""), UserWarning)
    names = [n for n in names if n not in refused]
    wrapped = {name: found for name in names if (found := _users_code(name))}
    if wrapped:  # slimrl would overwrite the user's own code: TRL with it runs instead
        warn(_wrapped_line(wrapped))
    names = [n for n in names if n not in wrapped]
    checkable = lambda n: every_trainer()[n].about.scenario is not None  # noqa: E731
    for name, row in preflight.failures(names, patches, checkable).items():  # an untested TRL: rows first
        _STOOD_DOWN[name] = row
        warn(preflight.stand_down_line(name, row, [f"{p.target}.{p.attribute}" for p in patches(name)]))
    names = [n for n in names if n not in _STOOD_DOWN]
    for name in names:
        for p in patches(name):
            if not _STOOD_DOWN.keys() & set(p.algorithms):  # a shared patch stands down with any of its trainers
                install(p)  # skips patches for other TRL releases
        _ACTIVE.add(name)
    if cpu_training():
        tune_malloc()  # host-memory trainers: give large freed blocks back to the OS (slimrl/compat/runtime/malloc.py)


def _missing_targets(name: str) -> list[str]:
    """The TRL attributes ``name``'s patches replace that the installed TRL does not have."""
    return [
        f"{p.target}.{p.attribute}" for p in patches(name) if p.applies() and not p.optional and not p.target_exists()
    ]


def _users_code(name: str) -> list[str]:
    """The TRL methods ``name``'s computing patches replace that hold code of the user's now (a wrapper installed
    before ``PatchFastRL``), each with where it is defined."""
    from slimrl.patching.machinery.fingerprints import computing
    from slimrl.patching.machinery.reach import function_of, is_users_code, owner_value
    from slimrl.patching.machinery.registry import is_installed

    found = []
    for p in patches(name):
        # a trainer class's method (a module's function or kernel swapped for a stand-in is not a wrapper of one)
        if ":" not in p.target or not computing(p) or not p.applies() or is_installed(p) or not p.target_exists():
            continue
        owner = p.resolve()
        # an attribute inherited from a class slimrl patched shows slimrl's replacement: TRL's is looked through
        value = owner_value(owner, p.attribute) if isinstance(owner, type) else getattr(owner, p.attribute)
        if is_users_code(value):
            code = function_of(value).__code__
            found.append(f"{p.target.rsplit(':', 1)[-1]}.{p.attribute} ({code.co_filename}:{code.co_firstlineno})")
    return found


def _wrapped_line(wrapped: dict[str, list[str]]) -> str:
    which = "; ".join(", ".join(found) for found in wrapped.values())
    return (
        f"slimrl leaves {', '.join(wrapped)} unpatched: your code replaced the TRL methods slimrl would replace "
        f"({which}) before PatchFastRL, and slimrl would overwrite it; they run as TRL with your code"
    )


def _refusal(refused: dict[str, list[str]]) -> str:
    from slimrl.compat.trl_info import trl_version

    which = "; ".join(f"{every_trainer()[n].trainer_class_name}: {', '.join(gone)}" for n, gone in refused.items())
    return (
        f"slimrl cannot patch these trainers of trl {trl_version()}, whose methods it replaces are gone "
        f"({which}): they run as TRL alone, unpatched; install a tested TRL or report it"
    )


def unpatch(algorithm: str | None = None) -> None:
    """Remove slimrl's patches (all, or one algorithm's), restoring TRL's attributes exactly."""
    names = list(every_trainer()) if algorithm is None else [_normalise(algorithm)]
    for name in names:
        _ACTIVE.discard(name)
    for name in names:
        for p in reversed(patches(name)):
            if not _ACTIVE.intersection(p.algorithms):
                uninstall(p)
    if not _ACTIVE:
        moved_names.uninstall()
        from slimrl.models.liger import remove_all

        remove_all()  # Liger's kernels on the models patched trainers put them on (transformers' modules again)


def PatchDPOTrainer() -> None:  # noqa: N802 (Unsloth's name)
    """Unsloth's ``PatchDPOTrainer()``: patch the preference trainers the installed TRL has (DPO, ORPO, KTO, CPO,
    BCO: the table's ``preference`` rows) in place, as ``PatchFastRL(name)`` does for each."""
    from slimrl.patching.table import TRAINERS

    for name in (n for n, spec in TRAINERS.items() if spec.preference):
        if trainer_available(name):
            PatchFastRL(name)


_AUTOPATCHED = False


def autopatch_enabled() -> bool:
    """``SLIMRL_AUTOPATCH`` is not 0 / false / no / off."""
    return env_flag("SLIMRL_AUTOPATCH", default=True)


def patch_on_first_use() -> None:
    """Patched on import, as Unsloth is: the first use of ``slimrl.FastLanguageModel`` / ``FastModel`` (``from
    slimrl import FastLanguageModel``) patches every trainer the installed TRL has, as ``PatchFastRL()`` would, and
    says so in one line; once per process. ``SLIMRL_AUTOPATCH=0`` turns it off (``PatchFastRL`` is then the way
    in); ``unpatch()`` undoes it either way. Current Unsloth notebooks never call ``PatchFastRL``: without this,
    changing their import line would leave TRL untouched."""
    global _AUTOPATCHED
    if _AUTOPATCHED or not autopatch_enabled():
        return
    _AUTOPATCHED = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's experimental-import notices
        PatchFastRL()
    print(
        "slimrl: TRL's trainers are patched (SLIMRL_AUTOPATCH=0 turns this off; slimrl.unpatch() restores TRL)",
        file=sys.stderr,
        flush=True,
    )


__all__ = [
    "PatchFastRL",
    "PatchDPOTrainer",
    "patch_on_first_use",
    "unpatch",
    "describe",
    "TRAINERS",
    "TrainerSpec",
    "TrainerNotAvailableError",
    "trainer_available",
    "trainer_and_config",
]
