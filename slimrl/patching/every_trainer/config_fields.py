"""slimrl's extra config fields, added to TRL's config dataclasses as real dataclass fields while patched.

Unsloth users pass these to any TRL config; TRL's dataclasses do not know them. Adding them as *fields* (not
just attributes) makes them behave like TRL's own: ``config.to_dict()`` / ``to_json_string()`` (what the Trainer
logs and saves with checkpoints) include them, ``TrlParser`` / ``HfArgumentParser`` turn them into flags and YAML
keys with help text, and ``dataclasses.replace`` keeps them. Three reversible patches per config class do it:
``__dataclass_fields__`` and ``__annotations__`` (new dicts: TRL's entries plus ours) and ``__init__`` (takes our
keywords, validates them before TRL's ``__post_init__`` runs, then sets them). ``unpatch`` puts back TRL's own
dict objects and ``__init__``.

Each field is declared once (:data:`FIELDS`: type, default, help, check, the capability it needs, why it does
nothing elsewhere); the flags, help texts, checks, refusals and docs/train.md's field table (:func:`field_table`, a
test fails when that copy is stale) all come from that declaration, and the trainers it acts on from the rows of
the trainer table that list it.

A config gets only the fields that act on its trainer (each trainer module passes ``fields=``): a field that would
do nothing there is never silently accepted. Passed with its default value (as Unsloth scripts do), it is dropped;
with any other value, the config refuses it with a ValueError that says why. ``max_seq_length`` on a config
without the field but with TRL's ``max_length`` (DPO, KTO, SFT, ORPO, CPO, Reward, ...) is TRL's old name for it:
renamed with a FutureWarning (:mod:`slimrl.patching.every_trainer.keywords`).

``vllm_sampling_params`` (an object, not a flag) is accepted by the GRPO config's ``__init__`` as a plain attribute.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from slimrl.compat.runtime.callsite import warnings_at_user_line
from slimrl.compat.trl_info import EVERY_RELEASE
from slimrl.patching.every_trainer.defaults import apply_config_defaults, record_explicit
from slimrl.patching.every_trainer.extra_fields import (  # noqa: F401  (FIELDS and the scopes are read from here)
    ALL_FIELDS,
    CHUNK_FIELDS,
    EXTRA_FIELDS,
    FIELDS,
    ONLINE_FIELDS,
    ExtraField,
)
from slimrl.patching.every_trainer.keywords import translate_config_kwargs
from slimrl.patching.every_trainer.validation import check_learning_rate
from slimrl.patching.machinery.registry import Patch


def validate_extra(name: str, value: Any) -> Any:
    """Check one extra field's value (before any other work); returns it, normalised."""
    return EXTRA_FIELDS[name].check(name, value)


def field_table(users: Callable[[str], tuple[str, ...]]) -> str:
    """docs/train.md's table of slimrl's config fields (from :data:`FIELDS`); ``users(name)``: the trainers a field
    acts on (:func:`slimrl.patching.table.field_users`), named unless it is every trainer with a log-prob route."""

    def where(f: ExtraField) -> str:
        return "every trainer whose log-probs slimrl computes" if f.acts_on == "log-probs" else ", ".join(users(f.name))

    rows = ["| field | default | acts on | meaning |", "|---|---|---|---|"]
    rows += [f"| `{f.name}` | `{f.default!r}` | {where(f)} | {f.doc or f.help} |" for f in FIELDS]
    return "\n".join(rows)


def _new_fields(own: dict, names: tuple[str, ...] = ALL_FIELDS) -> dict[str, dataclasses.Field]:
    fields = {}
    for name, extra in EXTRA_FIELDS.items():
        if name in own or name not in names:
            continue  # the config already has it (then TRL's own meaning applies)
        f = dataclasses.field(default=extra.default, metadata={"help": "slimrl: " + extra.help})
        f.name, f.type = name, extra.type
        f._field_type = dataclasses._FIELD  # what dataclasses.fields() lists
        fields[name] = f
    return fields


def extended_fields_factory(orig: dict, names: tuple[str, ...] = ALL_FIELDS) -> dict:
    """``__dataclass_fields__``: TRL's fields, then slimrl's (a new dict; TRL's is kept for ``unpatch``)."""
    return {**orig, **_new_fields(orig, names)}


def extended_annotations_factory(orig: dict, names: tuple[str, ...] = ALL_FIELDS) -> dict:
    """``__annotations__`` with slimrl's field types (``get_type_hints`` reads them for the argument parser)."""
    return {**orig, **{n: f.type for n, f in _new_fields(orig, names).items()}}


def _trl_field_names(config_cls: type) -> set[str]:
    """Names of the fields TRL itself declares on ``config_cls`` (also while slimrl's are added)."""
    own = vars(config_cls).get("__dataclass_fields__", {})
    return {n for n, f in own.items() if not f.metadata.get("help", "").startswith("slimrl:")}


def pop_extra_fields(
    config_cls: type,
    kwargs: dict,
    names: tuple[str, ...] = ALL_FIELDS,
    users: Callable[[str], tuple[str, ...]] | None = None,
) -> tuple[dict, dict]:
    """Split ``kwargs`` into (TRL's keywords, slimrl's validated extra fields with defaults filled in). A name TRL
    already declares on ``config_cls`` stays TRL's. A field not in ``names`` (no effect on this trainer) is dropped
    when passed at its default and refused otherwise, naming the trainers it acts on (``users(name)``)."""
    trl_names = _trl_field_names(config_cls)
    mine = {}
    for name, extra in EXTRA_FIELDS.items():
        default = extra.default
        if name in trl_names or name not in kwargs and name not in names:
            continue
        value = kwargs.pop(name, default)
        if name in names:
            mine[name] = validate_extra(name, value)
        elif value != default and not (name == "unsloth_num_chunks" and value is None):
            from slimrl.compat.trl_info import trl_version

            # named where few trainers have it: a log-prob field acts on every trainer with a route
            named = users(name) if users is not None and extra.acts_on != "log-probs" else ()
            acts = f" (it acts on {', '.join(named)})" if named else ""
            raise ValueError(
                f"{config_cls.__name__}({name}={value!r}) has no effect with trl {trl_version()}: "
                f"{extra.no_effect}{acts}; remove it"
            )
    return kwargs, mine


def _field_defaults(config_cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(config_cls) if f.default is not dataclasses.MISSING}


def generation_config_checks(config_cls: type, kwargs: dict, extra_fields: dict) -> dict:
    """GRPO's and RLOO's config checks (:func:`slimrl.patching.every_trainer.validation.check_grpo_config_kwargs`):
    temperature, completion length, the batch vs ``num_generations`` fix, ``unsloth_grpo_mini_batch``."""
    from slimrl.patching.every_trainer.validation import check_grpo_config_kwargs

    mini = extra_fields.get("unsloth_grpo_mini_batch")
    checked = check_grpo_config_kwargs({**kwargs, "unsloth_grpo_mini_batch": mini}, _field_defaults(config_cls))
    checked.pop("unsloth_grpo_mini_batch")
    return checked


def config_init_factory(
    orig_init,
    check=None,
    extra_attributes: tuple[str, ...] = (),
    fields: tuple[str, ...] = ALL_FIELDS,
    users: Callable[[str], tuple[str, ...]] | None = None,
):
    """A TRL config's ``__init__`` that translates legacy keywords (:mod:`slimrl.patching.every_trainer.keywords`),
    accepts and validates slimrl's extra fields, fills slimrl's defaults
    (:mod:`slimrl.patching.every_trainer.defaults`), then runs TRL's.

    ``check(config_cls, kwargs, extra_fields) -> kwargs``: a trainer's own checks of the keywords, run before TRL's
    ``__post_init__``. ``extra_attributes``: keywords kept as plain attributes (objects that are not flags, e.g.
    GRPO's ``vllm_sampling_params``). ``fields``: the extra fields that act on this trainer (the others are refused
    unless at their default, :func:`pop_extra_fields`, naming the trainers ``users(name)`` it acts on).
    """

    @functools.wraps(orig_init)
    def slimrl_config_fields_init(self, *args, **kwargs):
        attributes = {name: kwargs.pop(name, None) for name in extra_attributes}
        kwargs, mine = pop_extra_fields(type(self), translate_config_kwargs(type(self), dict(kwargs)), fields, users)
        check_learning_rate(kwargs, _field_defaults(type(self)))
        if check is not None:
            kwargs = check(type(self), kwargs, mine)
        user = dict(kwargs)
        kwargs, changed = apply_config_defaults(type(self), kwargs)
        _IN_INIT.add(id(self))
        try:
            with warnings_at_user_line():  # TRL's __post_init__ warnings name the user's line, not this wrapper
                orig_init(self, *args, **kwargs)
        finally:
            _IN_INIT.discard(id(self))
        for name, value in {**mine, **attributes}.items():
            setattr(self, name, value)
        record_explicit(self, user, changed)

    return slimrl_config_fields_init


_IN_INIT: set[int] = set()  # configs whose slimrl wrapper (__init__, or __post_init__ for a subclass) runs now


def config_post_init_factory(orig_post_init):
    """A TRL config's ``__post_init__`` that gives a dataclass *subclass* of it (TRL's own scripts declare
    ``@dataclass class ExampleSDPOConfig(SDPOConfig)``, whose generated ``__init__`` never calls the TRL class's)
    the first contact the class's own ``__init__`` gives: the settings passed (its fields away from their defaults)
    go through :func:`slimrl.patching.every_trainer.defaults.apply_config_defaults` before TRL's checks run, and are
    recorded for the changed-settings table. Construction through slimrl's ``__init__`` is left as it is."""

    @functools.wraps(orig_post_init)
    def slimrl_config_post_init(self, *args, **kwargs):
        if id(self) in _IN_INIT:
            return orig_post_init(self, *args, **kwargs)
        defaults = _field_defaults(type(self))
        user = {
            name: getattr(self, name)
            for name, default in defaults.items()
            if hasattr(self, name) and getattr(self, name) is not default and getattr(self, name) != default
        }
        settings, changed = apply_config_defaults(type(self), user)
        for name in changed:
            setattr(self, name, settings[name])
        _IN_INIT.add(id(self))  # a parent class's wrapper, further down, stands aside
        try:
            with warnings_at_user_line():
                result = orig_post_init(self, *args, **kwargs)
        finally:
            _IN_INIT.discard(id(self))
        record_explicit(self, user, changed)
        return result

    return slimrl_config_post_init


def config_patches(
    algorithm: str,
    target: str,
    fields: tuple[str, ...] = ALL_FIELDS,
    versions: str = EVERY_RELEASE,
    init=config_init_factory,
    users: Callable[[str], tuple[str, ...]] | None = None,
) -> list[Patch]:
    """The patches that give ``target`` (a TRL config class) slimrl's ``fields`` and its ``__init__`` (legacy
    keywords, the fields, the bf16 default where TRL's cannot run). ``init``: a factory ``f(orig_init, fields=)``
    (GRPO passes :func:`config_init_factory` with its own checks); ``users(name)``: the trainers a field acts on,
    for the refusal."""
    return [
        Patch(
            algorithm,
            target,
            "__dataclass_fields__",
            functools.partial(extended_fields_factory, names=fields),
            wrap=True,
            versions=versions,
        ),
        Patch(
            algorithm,
            target,
            "__annotations__",
            functools.partial(extended_annotations_factory, names=fields),
            wrap=True,
            versions=versions,
        ),
        Patch(
            algorithm,
            target,
            "__init__",
            functools.partial(init, fields=fields, users=users),
            wrap=True,
            versions=versions,
        ),
        Patch(
            algorithm, target, "__post_init__", config_post_init_factory, wrap=True, versions=versions, optional=True
        ),
    ]
