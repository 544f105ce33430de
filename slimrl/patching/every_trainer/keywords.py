"""Keywords from older TRL releases that common scripts (Unsloth notebooks among them) still pass.

Each is accepted with a one-line ``FutureWarning`` that names the new spelling, then handed to TRL as TRL spells
it today:

* trainers: ``tokenizer=`` -> ``processing_class=``; ``config=`` -> ``args=``, ``policy=`` -> ``model=``,
  ``ref_policy=`` -> ``ref_model=`` (old PPO scripts);
  config fields passed to the trainer (``DPOTrainer(..., beta=0.1, max_length=1024)``, TRL < 0.12) -> set on
  ``args``; ``max_prompt_length`` / ``max_target_length``, which TRL 1.12+ configs no longer have (prompt and
  completion are truncated together by ``max_length``), are dropped with a warning that says so.
* generation configs (GRPO, RLOO): ``max_new_tokens=`` -> ``max_completion_length=``.
* every config: ``warmup_ratio=r`` (transformers < 5) -> ``warmup_steps=r`` (transformers 5 reads a float in
  [0, 1) there as the same ratio of the total steps); ``max_prompt_length`` / ``max_target_length`` where the config
  no longer has them: dropped with the warning above (on GRPO/RLOO: the prompt is not cut, ``max_seq_length`` bounds
  prompt + completion).

Anything else TRL does not know still raises TRL's own ``TypeError``.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys

from slimrl.compat.runtime.callsite import warn

# old name -> new name; ``config``/``policy``/``ref_policy`` are TRL 0.12-0.14's PPOTrainer spellings
TRAINER_RENAMES = {"tokenizer": "processing_class", "config": "args", "policy": "model", "ref_policy": "ref_model"}
# max_seq_length: SFTConfig's name for max_length before TRL 0.20, and Unsloth's on every config; GRPO/RLOO keep it
# as slimrl's own field (their budget check), so the rename applies only where the config has max_length instead.
CONFIG_RENAMES = {"max_new_tokens": "max_completion_length", "max_seq_length": "max_length"}
REMOVED_CONFIG_FIELDS = {
    "max_prompt_length": "prompts are truncated together with the completion by max_length",
    "max_target_length": "completions are truncated together with the prompt by max_length",
}


def _warn(message: str) -> None:
    warn(message, FutureWarning)


def _config_class(trainer_cls: type) -> type | None:
    """The config dataclass that goes with ``trainer_cls`` (``DPOTrainer`` -> ``DPOConfig``)."""
    name = trainer_cls.__name__.replace("Trainer", "Config")
    for module_name in (trainer_cls.__module__, trainer_cls.__module__.rsplit(".", 1)[0], "trl"):
        module = sys.modules.get(module_name)
        found = getattr(module, name, None) if module else None
        if isinstance(found, type) and dataclasses.is_dataclass(found):
            return found
    return None


def translate_trainer_kwargs(trainer_cls: type, orig_init, args: tuple, kwargs: dict) -> dict:
    """Rewrite legacy keywords in a trainer constructor call (before any work); returns new kwargs."""
    params = inspect.signature(orig_init).parameters
    accepts_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs = dict(kwargs)
    cls = trainer_cls.__name__
    _rename(kwargs, TRAINER_RENAMES, params, cls, old_name_note=True)
    if accepts_var_kw:
        return kwargs
    config_cls = _config_class(trainer_cls)
    fields = config_cls.__dataclass_fields__ if config_cls else {}
    moved = {k: kwargs.pop(k) for k in list(kwargs) if k not in params and k in fields}
    for key in [k for k in kwargs if k not in params and k in REMOVED_CONFIG_FIELDS]:
        kwargs.pop(key)
        _warn(
            f"{cls}({key}=...) is ignored: {config_cls.__name__ if config_cls else 'the config'} in this TRL has "
            f"no {key} ({REMOVED_CONFIG_FIELDS[key]})"
        )
    if moved:
        positional = [n for n in params if n != "self"]
        config = kwargs.get("args")
        if config is None and "args" in positional and positional.index("args") < len(args):
            config = args[positional.index("args")]
        names = ", ".join(f"{k}=" for k in moved)
        if config is None:
            config = config_cls(**moved)
            kwargs["args"] = config
        else:
            for key, value in moved.items():
                setattr(config, key, value)
        _warn(f"{cls}({names}...) is deprecated; set them on {config_cls.__name__}(...) (slimrl set them on args)")
    return kwargs


def translate_config_kwargs(config_cls: type, kwargs: dict) -> dict:
    """Rewrite legacy keywords in a config constructor call (module docstring)."""
    kwargs = dict(kwargs)
    fields = config_cls.__dataclass_fields__
    _rename(kwargs, CONFIG_RENAMES, fields, config_cls.__name__)
    owner = config_cls.__name__
    if "warmup_ratio" in kwargs and "warmup_ratio" not in fields and "warmup_steps" in fields:
        ratio = kwargs.pop("warmup_ratio")
        if kwargs.get("warmup_steps"):
            raise TypeError(f"{owner}: pass warmup_steps= only (got both warmup_ratio= and warmup_steps=)")
        if not isinstance(ratio, int | float) or isinstance(ratio, bool) or not 0 <= ratio < 1:
            raise ValueError(f"{owner}(warmup_ratio={ratio!r}) is invalid: use a fraction in [0, 1)")
        _warn(
            f"{owner}(warmup_ratio={ratio}) is transformers' old name; slimrl passed it on as "
            f"warmup_steps={float(ratio)} (a float in [0, 1) is the same ratio of the total steps)"
        )
        kwargs["warmup_steps"] = float(ratio)
    for key in [k for k in kwargs if k not in fields and k in REMOVED_CONFIG_FIELDS]:
        kwargs.pop(key)
        why = (
            "the prompt is kept whole; max_seq_length bounds prompt + completion"
            if "max_length" not in fields
            else REMOVED_CONFIG_FIELDS[key]
        )
        _warn(f"{owner}({key}=...) is ignored: {owner} in this TRL has no {key} ({why})")
    return kwargs


def _rename(kwargs: dict, renames: dict[str, str], known, owner: str, old_name_note: bool = False) -> None:
    """In place: each old keyword the callee does not know but whose new name it does becomes the new one (with a
    FutureWarning); both passed is a TypeError."""
    for old, new in renames.items():
        if old in kwargs and old not in known and new in known:
            if new in kwargs:
                note = f"; {old}= is its old name" if old_name_note else ""
                raise TypeError(f"{owner}: pass {new}= only (got both {old}= and {new}={note})")
            _warn(f"{owner}({old}=...) is deprecated; use {new}=... (slimrl passed it on as {new})")
            kwargs[new] = kwargs.pop(old)


def bound_inputs(orig_init, args: tuple, kwargs: dict) -> dict:
    """``{parameter name: value}`` of a trainer constructor call (positional arguments named)."""
    names = [n for n in inspect.signature(orig_init).parameters if n != "self"]
    return {**dict(zip(names, args)), **kwargs}
