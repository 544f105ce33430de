"""One trainer slimrl patches, as a record (:class:`TrainerSpec`, with :class:`About` it): what its patches need and
what the documentation, ``slimrl train`` and ``slimrl verify`` say about it. The rows themselves are
:data:`slimrl.patching.table.TRAINERS` (trainers with a module of their own) and the trainers read from the installed
TRL (:mod:`slimrl.patching.derived`)."""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from slimrl.compat.trl_info import EVERY_RELEASE, TESTED_TRL
from slimrl.patching.every_trainer.config_fields import config_init_factory
from slimrl.patching.every_trainer.extra_fields import FIELDS
from slimrl.patching.every_trainer.steps import training_step_factory
from slimrl.patching.machinery.registry import Patch
from slimrl.planning.settings import Workload

Layouts = tuple[tuple[str, ...], ...]
PAIRED: Layouts = (("chosen", "rejected"),)  # with or without an explicit "prompt" (TRL extracts the prefix)
PROMPT: Layouts = (("prompt",),)
# what slimrl gives a trainer (docs/compatibility.md, slimrl verify --list)
MEMORY_PATHS = "memory paths"  # a log-prob route of slimrl's, with a parity test
CHECKS_ONLY = "checks and guards"  # nothing vocabulary-sized to save (a score head): checks and guards
FIRST_CONTACT = "first contact"  # precision default, offline push, Unsloth's and legacy keywords, warnings' lines


@dataclass(frozen=True)
class Route:
    """One way a trainer's log-probs reach slimrl's ops, declared once in its module under ``routes/`` (``ROUTE``):
    what it does, the TRL releases on which it can serve, and the patches its users share (``shared(names)``: the
    fused head's kernel swap, installed while any of them is patched), the config fields that act on its users
    while it serves (a row need not restate them) and, where a served call can still be handed to TRL's own code,
    the predicate that says whether it is taken (``applies(args, device)``). A trainer's row names the routes it
    takes by calling one with its entry methods: ``fused_head.ROUTE("_compute_loss")``."""

    name: str
    summary: str  # docs/compatibility.md: what it does
    releases: str = EVERY_RELEASE  # PEP 440: the TRL releases that have what it hooks (compat.trl_info)
    shared: Callable[[tuple[str, ...]], list[Patch]] | None = None
    fields: tuple[str, ...] = ()  # slimrl config fields that act on its users where it serves
    applies: Callable[[Any, Any], bool] | None = None  # applies(args, device): taken, not handed to TRL's code

    def __call__(self, *entries: str) -> RouteUse:
        return RouteUse(self, entries)

    def serves(self) -> bool:
        """Whether the installed TRL has what this route hooks."""
        from slimrl.compat import trl_info

        return trl_info.has(self.releases)

    def takes(self, args: Any, device: Any) -> bool:
        """Whether a run with config ``args`` on ``device`` goes through this route (it serves, and its predicate,
        if any, does not hand the call to TRL's own code)."""
        return self.serves() and (self.applies is None or self.applies(args, device))


@dataclass(frozen=True)
class RouteUse:
    """A trainer's use of a route: ``entries`` are its TRL methods through which its log-probs enter the route
    beyond the ones its own patches replace (the fused head's callers). A TRL subclass that overrides any of them
    (or a replaced method) does not inherit the route (:mod:`slimrl.patching.derived`)."""

    route: Route
    entries: tuple[str, ...] = ()


@dataclass(frozen=True)
class About:
    """What the documentation, ``slimrl train`` and ``slimrl verify`` read about a trainer: nothing here changes what
    its patches do (those are :class:`TrainerSpec`'s fields)."""

    note: str = ""  # docs/compatibility.md: what slimrl does for it
    parity_test: str = "—"  # docs/compatibility.md: where its exactness is tested
    cli: str | None = None  # slimrl train: "online" | "paired" | "unpaired" | "sft" (None: not offered)
    scenario: Callable | None = None  # slimrl verify's run: scenario(kit, loss_type) -> trainer, in its module
    not_verified: str = ""  # why it has no scenario (said under slimrl verify's table)
    layer: str = MEMORY_PATHS  # MEMORY_PATHS | CHECKS_ONLY | FIRST_CONTACT
    # slimrl verify's rows: "default" (one), "config" (each loss_type its config offers), "grpo" (GRPO's and the
    # agentic rows)
    loss_types: str = "default"
    generation_check: bool = False  # slimrl verify checks its sampled tokens' log-probs against the training model


@dataclass(frozen=True)
class TrainerSpec:
    """One trainer slimrl patches (see the module docstring)."""

    name: str  # PatchFastRL's name for it
    trainer: str  # "module:Class" in every supported release
    config: str | None  # "module:Class" (None: TRL publishes none for it; it takes its base's)
    releases: str = EVERY_RELEASE  # TRL releases that have it (compat.trl_info); its patches apply only there
    instead: str = ""  # what to use where TRL removed it (the one line PatchFastRL says then)
    layouts: Layouts | Callable[[Any], Layouts] = ()  # dataset column layouts (raw, then pre-tokenized)
    routes: tuple[RouteUse, ...] = ()  # the log-prob routes it takes (each serves the TRL releases it declares)
    fields: tuple[str, ...] = ()  # slimrl config fields beyond its routes' that act on it (see acts_on)
    config_init: Callable = config_init_factory  # factory(orig_init, fields=) for its config's __init__
    init_hooks: tuple[Callable[[Any, Any], None], ...] = ()  # run as hook(model, args) before TRL's __init__
    after_init: tuple[Callable[[Any], None], ...] = ()  # run as hook(trainer) after TRL's __init__
    auto_fit: bool = False  # honours slimrl_auto_fit (slimrl.patching.online.autofit) before TRL's __init__
    training_step: Callable | None = training_step_factory  # factory for its training_step (None: not patched)
    guard_rewards: bool = True  # Python reward functions checked (slimrl.patching.every_trainer.reward_guard)
    base: str | None = None  # the trainer whose route it inherits as TRL's subclass of it (slimrl.patching.derived)
    patches: tuple[Patch, ...] = field(default=())  # its own, from trainers/<name>.py
    workload: Workload | None = None  # what one step does: auto-fit's and `slimrl plan`'s (None: not planned)
    preference: bool = False  # one of the preference trainers Unsloth's PatchDPOTrainer() patches
    about: About = field(default_factory=lambda: About())  # what the docs, the CLI and verify read

    def uses(self, route: Route) -> bool:
        return any(use.route is route for use in self.routes)

    @property
    def acts_on(self) -> tuple[str, ...]:
        """slimrl's config fields that act on it (in :data:`FIELDS`' order): its own and those of each route it takes
        that serves the installed TRL; a config refuses the others unless they are at their defaults."""
        wanted = set(self.fields) | {f for use in self.routes if use.route.serves() for f in use.route.fields}
        return tuple(f.name for f in FIELDS if f.name in wanted)

    @property
    def last_release(self) -> str | None:
        """The newest tested TRL release that has it, where a newer one lacks it (None: every release has it)."""
        from packaging.specifiers import SpecifierSet

        if self.releases == EVERY_RELEASE:
            return None
        return str(max(SpecifierSet(self.releases).filter(Version(v) for v in TESTED_TRL)))

    def enters(self, method: str) -> bool:
        """Whether its log-probs enter a route that serves the installed TRL through its TRL method ``method`` (a
        method a route names as an entry is left to run, with slimrl's code inside it)."""
        return any(method in use.entries and use.route.serves() for use in self.routes)

    @property
    def route_entries(self) -> set[str]:
        """The methods its route uses name as entries (:class:`RouteUse`)."""
        return {e for use in self.routes for e in use.entries}

    @property
    def trainer_module(self) -> str:
        return self.trainer.partition(":")[0]

    @property
    def trainer_class_name(self) -> str:
        return self.trainer.partition(":")[2]

    def available(self) -> bool:
        """Whether the installed TRL ships this trainer."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # trl.experimental's import warning
            try:
                return importlib.util.find_spec(self.trainer_module) is not None
            except ModuleNotFoundError:
                return False

    def classes(self) -> tuple[type, type | None]:
        """(trainer class, config class) of the installed TRL."""
        from slimrl.patching.machinery.catalog import resolve

        return resolve(self.trainer), resolve(self.config) if self.config else None

    def dataset_layouts(self, args: Any = None) -> Layouts:
        return self.layouts(args) if callable(self.layouts) else self.layouts
