"""What slimrl does for every trainer the installed TRL ships beyond its own table
(:mod:`slimrl.patching.machinery.catalog` reads them from TRL's modules; :data:`slimrl.patching.table.TRAINERS` is the
table).

Each trainer TRL publishes gets one of three treatments, decided from TRL's classes when the patches load:

* **alias**: a subclass TRL publishes under a name the table already has (``trl.experimental.kto.KTOTrainer``,
  BEMA's ``DPOTrainer``, TRL 1.12's ``gspo_token.GRPOTrainer``, the experimental ``DistillationTrainer``): patched
  with that name. Its constructor and config get the base's layer; its other methods are the base's, patched with
  it, and a method it overrides that the base's patches wrap is wrapped the same way.
* **inherited route**: a subclass of a table trainer that keeps the method through which the base's log-probs reach
  slimrl (``GMPOTrainer``: a ``GRPOTrainer`` whose only change is ``_compute_loss``, which calls GRPO's log-prob
  method) and whose parity with TRL alone is checked (:data:`VERIFIED_ROUTES`): its own name and the base's whole
  layer. The base's patches are installed with it (it runs the methods
  it inherits), and each of the base's wrapping patches whose method it overrides wraps its override too.
* **first contact**: every other trainer (GKD, GOLD, TPO, A2PO, SDFT, SDPO, IWOPD, the distillation trainers,
  AsyncGRPO, ...): the layer every script meets before training — TRL's bf16 default where it cannot run, the
  offline ``push_to_hub`` fallback, Unsloth's config keywords (accepted at their defaults, refused with the reason
  otherwise: none acts on these trainers) and the legacy keywords, warnings at the user's line — and nothing
  else: its training step, losses and reward functions are TRL's own.

A trainer counts as keeping its base's route when it overrides none of the methods that enter it: the methods the
base's own patches replace outright, and for the fused-head trainers the TRL method that calls the fused head
(its :class:`slimrl.patching.spec.RouteUse` entries).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from slimrl.patching.machinery.catalog import Shipped, resolve
from slimrl.patching.spec import FIRST_CONTACT, About, TrainerSpec

# why a first-contact trainer has no memory path (docs/compatibility.md); the default says it in general terms
WHY_NOT = {
    "distillation": "its loss is a divergence over the whole vocabulary, already chunked by TRL's "
    "`ChunkedDivergenceFunction`; no log-prob route of slimrl's applies",
    "gkd": "`compute_loss` builds the student's and the teacher's full logits for a divergence over the whole "
    "vocabulary (no per-token log-prob for slimrl's kernel to serve)",
    "async_grpo": "its log-probs go through TRL's fused head and therefore through slimrl's kernel whenever GRPO, "
    "RLOO, DPO, KTO or SFT is patched, but its forward needs TRL's FlashAttention-3 tree kernel (CUDA) "
    "and a vLLM server, so no parity test runs here; the kernel swap is not installed for it alone",
    "tpo": "`_compute_loss` reads full `outputs.logits` in its own method",
    "a2po": "`_get_sequence_logps` reads full logits in its own method",
    "gold": "its loss is a generalized JSD / ULD over the student's and the teacher's full logits",
    "iwopd": "its importance-weighted distillation loss reads the student's and the teacher's full logits",
    "sdft": "`_forward_logits` builds full logits for a divergence against the model's own teacher context (top-k "
    "over the whole vocabulary)",
    "sdpo": "`_forward_logits` builds full logits for a divergence against the model's own teacher context (top-k "
    "over the whole vocabulary)",
    "async_distillation": "its student forward and divergence run in its own `_compute_loss`, against a teacher "
    "served by another process",
}
# subclasses that keep their base's route and whose parity with TRL alone is checked (each also has its `slimrl
# verify` row); one that keeps a route but is not listed here gets the first-contact layer (its constructor needs what
# its base's verify scenario does not build: TRL 1.12's MiniLLM a teacher, Nash-MD a reward model)
VERIFIED_ROUTES = {
    "gmpo": "two steps with generation, old log-probs and KL, `tests/patching/trainers/test_gmpo.py`",
    "grpo_with_replay_buffer": "its `slimrl verify --tiny` row (TRL 1.12)",
}
_GENERIC = "computes its loss from full logits (or a divergence) in methods of its own that slimrl does not serve"


@dataclass(frozen=True)
class Treatment:
    """The patches one trainer of the installed TRL gets beyond the table's: ``spec``'s layer under ``name`` for its
    class ``trainer`` and its config ``config`` (None: no config layer), plus, where it subclasses ``base``, the
    base's wrapping patches copied for the ``overridden`` methods (:mod:`slimrl.patching.table` builds them). A
    first-contact trainer (``base`` None) gets its own row's patches."""

    name: str
    trainer: str
    config: str | None
    spec: TrainerSpec
    base: TrainerSpec | None = None
    overridden: frozenset[str] = frozenset()


@dataclass
class Derived:
    """The outcome of :func:`derive`."""

    specs: dict[str, TrainerSpec] = field(default_factory=dict)  # new names (inherited route, first contact)
    treatments: list[Treatment] = field(default_factory=list)  # the patches each shipped trainer gets, in order
    users: dict[str, set[str]] = field(default_factory=dict)  # table name -> new names that install its patches
    aliases: dict[str, list[str]] = field(default_factory=dict)  # table name -> the alias classes ("module:Class")


def _overrides(cls: type, base: type) -> set[str]:
    """Attributes defined by ``cls`` or a class between it and ``base`` in its MRO."""
    out: set[str] = set()
    for klass in cls.__mro__:
        if klass is base:
            break
        out |= set(vars(klass))
    return out


def _entries(spec: TrainerSpec) -> set[str]:
    """The methods through which ``spec``'s log-probs reach slimrl (module docstring)."""
    replaced = {p.attribute for p in spec.patches if not p.wrap and p.target == spec.trainer}
    return replaced | spec.route_entries


def derive(table: dict[str, TrainerSpec], shipped: tuple[Shipped, ...]) -> Derived:
    """The treatment of each trainer of ``shipped`` that is not one of ``table``'s (module docstring)."""
    out = Derived()
    classes: dict[type, str] = {}
    for name, spec in table.items():
        if spec.available():
            try:
                classes[resolve(spec.trainer)] = name
            except (ImportError, AttributeError):
                continue
    for found in shipped:
        cls = resolve(found.trainer)
        if cls in classes:
            continue
        base_cls = next((c for c in cls.__mro__[1:] if c in classes), None)
        base_name = classes.get(base_cls)
        base = table.get(base_name) or out.specs.get(base_name)
        if base is not None and found.name == base_name:  # alias
            out.treatments.append(
                Treatment(base_name, found.trainer, found.config, base, base, frozenset(_overrides(cls, base_cls)))
            )
            out.aliases.setdefault(base_name, []).append(found.trainer)
            classes[cls] = base_name
            continue
        if found.name in table or found.name in out.specs:
            continue  # an unrelated class under a taken name: left to TRL
        keeps_route = (
            base is not None
            and base_name in table
            and bool(base.routes)
            and not _overrides(cls, base_cls) & _entries(base)
        )
        if keeps_route and found.name in VERIFIED_ROUTES:
            spec = _inherited(found, base, base_name)
            out.treatments.append(
                Treatment(found.name, found.trainer, spec.config, spec, base, frozenset(_overrides(cls, base_cls)))
            )
            out.users.setdefault(base_name, set()).add(found.name)
        else:
            spec = _first_contact(found, base, keeps_route)
            out.treatments.append(Treatment(found.name, found.trainer, spec.config, spec))
        out.specs[found.name] = spec
        classes[cls] = found.name
    return out


def _inherited(found: Shipped, base: TrainerSpec, base_name: str) -> TrainerSpec:
    note = (
        f"inherits {base.trainer_class_name}'s route (a subclass that keeps the methods its log-probs go "
        f"through): {base.about.note}"
    )
    return dataclasses.replace(
        base,
        name=found.name,
        trainer=found.trainer,
        config=found.config or base.config,
        patches=(),
        base=base_name,
        instead="",
        about=About(
            note,
            VERIFIED_ROUTES[found.name],
            None,
            functools.partial(_inherited_scenario, base.about.scenario) if base.about.scenario else None,
            base.about.not_verified,
            base.about.layer,
        ),
    )


def _inherited_scenario(scenario: Callable, kit, loss_type: str):
    """The base's ``slimrl verify`` scenario on the subclass (``kit`` builds its trainer and config); its one row,
    ``"default"``, is the loss type its config defaults to."""
    fields = getattr(kit.config_cls, "__dataclass_fields__", {})
    if loss_type == "default" and "loss_type" in fields:
        loss_type = fields["loss_type"].default
    return scenario(kit, loss_type)


def _first_contact(found: Shipped, base: TrainerSpec | None, keeps_route: bool = False) -> TrainerSpec:
    why = WHY_NOT.get(found.name) or (WHY_NOT.get(base.name) if base is not None else None) or _GENERIC
    if keeps_route and base is not None:
        why = (
            f"not verified: it keeps {base.trainer_class_name}'s methods, which run through slimrl's route while "
            f"`{base.name}` is patched, but its constructor needs more than {base.name}'s verify scenario builds"
        )
    config = found.config or (base.config if base is not None else None)
    note = (
        f"precision default, offline push, Unsloth's and legacy keywords, warnings at the user's line; "
        f"no memory path: {why}"
    )
    return TrainerSpec(
        found.name,
        found.trainer,
        config,
        training_step=None,
        guard_rewards=False,
        about=About(note, layer=FIRST_CONTACT, not_verified="first contact only: its training is TRL's own"),
    )
