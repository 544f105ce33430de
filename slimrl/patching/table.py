"""The one table of trainers slimrl patches (:data:`TRAINERS`), and everything derived from it.

Each trainer's module (``slimrl/patching/trainers/<name>.py``) declares its complete row, ``SPEC``: a
:class:`TrainerSpec` saying where TRL keeps it and its config, which TRL releases have it, the dataset layouts it
accepts, the log-prob routes it takes, which of slimrl's config fields act on it, the hooks its ``__init__`` runs,
its ``training_step`` wrapper, the patches specific to it, its workload, verify scenario and loss types, and how
``slimrl train`` and the docs present it. This module lists those rows in order; from the table come:

* the registry entries every trainer shares (:func:`spec_patches`: ``__init__`` checks, ``training_step`` guard,
  config fields and ``__init__``) plus each trainer's own, registered by :func:`register_all`;
* ``PatchFastRL``'s names and availability checks (:mod:`slimrl.patching`);
* the dataset layouts of :mod:`slimrl.patching.every_trainer.validation`;
* ``slimrl train``'s algorithms (:data:`CLI_KINDS`);
* each route's users (:func:`users_of`) and the patches they share (``Route.shared``);
* the trainers each of slimrl's config fields acts on (:func:`field_users`, for the refusals and docs/train.md);
* docs/compatibility.md's tables and docs/train.md's field table (:mod:`slimrl.patching.doc_tables`; a test fails
  when a copy is stale) and ``python -m slimrl.patching``'s listing (through the registry).

Adding a trainer: write ``trainers/<name>.py`` (its ``TRAINER``, ``CONFIG``, specific ``PATCHES`` and ``SPEC``),
list its ``SPEC`` here, add its parity test. See docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from slimrl.compat.trl_info import EVERY_RELEASE
from slimrl.patching.derived import Treatment, derive
from slimrl.patching.every_trainer.config_fields import config_patches
from slimrl.patching.every_trainer.processors import processor_patch
from slimrl.patching.every_trainer.steps import push_to_hub_factory
from slimrl.patching.every_trainer.trainer_init import trainer_init_factory
from slimrl.patching.machinery.catalog import shipped
from slimrl.patching.machinery.registry import Patch, patches, register
from slimrl.patching.routes import shared_prefix
from slimrl.patching.spec import Route, TrainerSpec
from slimrl.patching.trainers import bco, cpo, dpo, grpo, kto, online_dpo, orpo, ppo, prm, reward, rloo, sft, xpo
from slimrl.planning.settings import Workload

# each trainer's row is its module's SPEC (slimrl/patching/trainers/<name>.py); this is their order in the docs
TRAINERS: dict[str, TrainerSpec] = {
    s.name: s
    for s in (
        grpo.SPEC,
        dpo.SPEC,
        kto.SPEC,
        orpo.SPEC,
        cpo.SPEC,
        sft.SPEC,
        reward.SPEC,
        rloo.SPEC,
        online_dpo.SPEC,
        ppo.SPEC,
        bco.SPEC,
        xpo.SPEC,
        prm.SPEC,
    )
}

EXTRA: dict[str, TrainerSpec] = {}  # the installed TRL's other trainers (slimrl.patching.derived), at first use
ALIASES: dict[str, list[str]] = {}  # table name -> TRL's other classes patched under it ("module:Class")


def every_trainer() -> dict[str, TrainerSpec]:
    """The table and every other trainer the installed TRL ships (read from TRL's modules when the patches load)."""
    patches()  # the registry's first use reads the installed TRL's trainers
    return {**TRAINERS, **EXTRA}


def trainer_layouts(trainer_cls: type, args: Any = None) -> tuple[str | None, tuple[tuple[str, ...], ...]]:
    """(the TRL trainer name whose layouts apply, its layouts), from the trainers table
    (:data:`TRAINERS`; raw forms first, then the pre-tokenized forms the installed TRL passes
    through untokenized): a subclass reads its TRL base's."""
    by_class = {spec.trainer_class_name: spec for spec in TRAINERS.values()}
    name = next((c.__name__ for c in trainer_cls.__mro__ if c.__name__ in by_class), None)
    return name, by_class[name].dataset_layouts(args) if name else ()


CLI_KINDS = {name: spec.about.cli for name, spec in TRAINERS.items() if spec.about.cli}  # slimrl train's algorithms
PLANNED = {name: spec.workload for name, spec in TRAINERS.items() if spec.workload}  # slimrl plan's algorithms


def routes() -> tuple[Route, ...]:
    """Every route the table's trainers take, in the order they first appear."""
    return tuple(dict.fromkeys(use.route for spec in TRAINERS.values() for use in spec.routes))


def users_of(route: Route) -> tuple[str, ...]:
    """The table's trainers that take ``route`` (on the releases it serves)."""
    return tuple(name for name, spec in TRAINERS.items() if spec.uses(route))


def spec_patches(spec: TrainerSpec) -> list[Patch]:
    """Every patch of one trainer: the shared ones (``__init__``, ``training_step``, config fields and
    ``__init__``) and its own; all limited to the TRL releases that have it."""
    out = [
        Patch(spec.name, spec.trainer, "__init__", _init_factory(spec), wrap=True),
        Patch(spec.name, spec.trainer, "push_to_hub", push_to_hub_factory, wrap=True, passthrough=True),
    ]
    if spec.training_step is not None:
        out.append(Patch(spec.name, spec.trainer, "training_step", spec.training_step, wrap=True, passthrough=True))
    if spec.config:
        out += _config_layer(spec.name, spec.config, spec)
    out += spec.patches
    if spec.releases != EVERY_RELEASE:
        out = [dataclasses.replace(p, versions=spec.releases) for p in out]
    return out


def _config_layer(name: str, config: str, spec: TrainerSpec) -> list[Patch]:
    """``config`` given ``spec``'s config layer (its fields and ``__init__``) under ``name``."""
    return config_patches(name, config, fields=spec.acts_on, init=spec.config_init, users=field_users)


def field_users(name: str) -> tuple[str, ...]:
    """The table's trainers slimrl's config field ``name`` acts on (their rows list it), by TRL's name for them
    without "Trainer" (``GRPO``)."""
    return tuple(s.trainer_class_name.removesuffix("Trainer") for s in TRAINERS.values() if name in s.acts_on)


def treatment_patches(t: Treatment) -> list[Patch]:
    """The patches of a trainer read from the installed TRL (:class:`~slimrl.patching.derived.Treatment`): a
    first-contact row's own, else ``t.spec``'s constructor and config layers under ``t.name`` and the base's
    wrapping class patches re-targeted at ``t.trainer`` for the methods it overrides (not its constructor: it gets
    its own)."""
    if t.base is None:
        return spec_patches(t.spec)
    out = [Patch(t.name, t.trainer, "__init__", _init_factory(t.spec), wrap=True)]
    if t.config:
        out += _config_layer(t.name, t.config, t.spec)
    return out + [
        dataclasses.replace(p, algorithm=t.name, target=t.trainer)
        for p in spec_patches(t.base)
        if p.wrap and p.target == t.base.trainer and p.attribute in t.overridden and p.attribute != "__init__"
    ]


def _init_factory(spec: TrainerSpec) -> Callable:
    hooks = spec.init_hooks
    fit = functools.partial(auto_fit_hook, algorithm=spec.name, workload=spec.workload) if spec.auto_fit else None

    def trainer_init(orig_init):
        return trainer_init_factory(
            orig_init,
            hooks,
            fit=fit,
            algorithm=spec.name,
            workload=spec.workload,
            trainer=spec.trainer_class_name,
            layouts=spec.dataset_layouts,
            after=spec.after_init,
            guard_rewards=spec.guard_rewards,
        )

    trainer_init.__qualname__ = "trainer_init_factory"
    return trainer_init


def auto_fit_hook(bound: dict[str, Any], algorithm: str, workload: Workload) -> None:
    """slimrl's tiled-MLP default, then :func:`slimrl.patching.online.autofit.apply_auto_fit` (which plans the model
    as tiled), both imported when a trainer is built."""
    from slimrl.patching.online.autofit import apply_auto_fit
    from slimrl.patching.online.lean_default import apply_lean_default

    apply_lean_default(bound, algorithm, workload)
    apply_auto_fit(bound, algorithm, workload)


def register_all() -> None:
    """Register the table's patches and those of the installed TRL's other trainers (at the registry's first use):
    a table trainer's patches are also installed with the trainers that inherit its route."""
    found = derive(TRAINERS, shipped())
    EXTRA.update(found.specs)
    ALIASES.update(found.aliases)

    def with_users(patch: Patch) -> Patch:
        users = sorted({u for a in patch.algorithms for u in found.users.get(a, ())})
        return dataclasses.replace(patch, algorithm=patch.algorithms + tuple(users)) if users else patch

    for spec in TRAINERS.values():
        for patch in spec_patches(spec):
            register(with_users(patch))
    for patch in (p for t in found.treatments for p in treatment_patches(t)):
        register(patch)
    for route in routes():
        for patch in route.shared(users_of(route)) if route.shared else ():
            register(with_users(patch))
    packing = tuple(n for n, s in TRAINERS.items() if s.workload and s.workload.generates and s.workload.shared_prefix)
    register(with_users(shared_prefix.attention_patch(packing)))  # the layout's attention, for those that pack
    register(processor_patch((*TRAINERS, *EXTRA)))  # TRL's vision scripts load processors themselves
