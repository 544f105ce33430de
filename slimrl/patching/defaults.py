"""Defaults slimrl changes when the user did not set them, and the one table that says so at trainer start.

Unsloth's RL layer retunes many TrainingArguments defaults (DESIGN.md §7). slimrl's promise is TRL's math, so
it changes only what does not alter the training recipe:

* ``logging_steps`` 10 -> 1: a metrics row per step (RL runs are short and noisy; Unsloth does the same).
* ``bf16`` / ``fp16`` from the model's dtype: a float32 model is trained in float32 (TRL >= 1.15 turns bf16
  autocast on by default, which on a CPU is slower and less exact); a float16 model gets ``fp16`` on CUDA
  instead of the bf16 that would clash with it.

Kept as TRL's on purpose (they change the result of a run, and a TRL script must train the same with slimrl):
learning rate, batch size, gradient accumulation, weight decay, warmup, seed, ``num_generations``, and the
optimizer (``adamw_8bit`` needs bitsandbytes, which is optional here; pass ``optim="adamw_8bit"`` to use it).
"""

from __future__ import annotations

from typing import Any

# Config defaults slimrl sets at config time when the keyword was not passed: name -> slimrl's value.
CONFIG_DEFAULTS = {"logging_steps": 1}


def apply_config_defaults(config_cls: type, kwargs: dict) -> tuple[dict, dict]:
    """(kwargs with slimrl's defaults filled in, {name: (TRL's default, slimrl's)} of what changed)."""
    import dataclasses

    trl_defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    changed = {}
    for name, value in CONFIG_DEFAULTS.items():
        if name not in kwargs and name in trl_defaults and trl_defaults[name] != value:
            kwargs = {**kwargs, name: value}
            changed[name] = (trl_defaults[name], value)
    return kwargs, changed


def record_explicit(config: Any, kwargs: dict, changed: dict) -> None:
    """Remember which keywords the user passed and what slimrl changed (read at trainer start)."""
    config._slimrl_explicit = frozenset(kwargs) - set(changed)
    config._slimrl_changed = dict(changed)


def apply_precision_defaults(model: Any, config: Any) -> None:
    """``bf16`` / ``fp16`` from the model's dtype when the user set neither (see the module docstring)."""
    import torch

    explicit = getattr(config, "_slimrl_explicit", None)
    if config is None or model is None or isinstance(model, str) or explicit is None:
        return
    if {"bf16", "fp16"} & explicit:
        return
    dtype = getattr(model, "dtype", None)
    new_bf16, new_fp16 = config.bf16, config.fp16
    if dtype == torch.float32 and config.bf16:
        new_bf16 = False
    elif dtype == torch.float16 and config.bf16:
        new_bf16, new_fp16 = False, torch.cuda.is_available()
    if (new_bf16, new_fp16) == (config.bf16, config.fp16):
        return
    for name, new in (("bf16", new_bf16), ("fp16", new_fp16)):
        if getattr(config, name) != new:
            config._slimrl_changed[name] = (getattr(config, name), f"{new} (model is {str(dtype).split('.')[-1]})")
            setattr(config, name, new)
    if hasattr(config, "mixed_precision"):  # derived in TrainingArguments.__post_init__ (transformers >= 5)
        config.mixed_precision = "fp16" if new_fp16 else "bf16" if new_bf16 else "no"


def print_changed_defaults(config: Any) -> None:
    """One short table of the defaults slimrl changed for this config (main process only, once per config)."""
    changed = getattr(config, "_slimrl_changed", None)
    if not changed or getattr(config, "_slimrl_defaults_printed", False):
        return
    config._slimrl_defaults_printed = True
    if getattr(config, "process_index", 0) != 0:
        return
    width = max(len(n) for n in changed)
    rows = "\n".join(f"  {n:<{width}}  {old!s} -> {new!s}" for n, (old, new) in changed.items())
    print(f"slimrl: defaults changed (pass them to {type(config).__name__} to keep TRL's):\n{rows}", flush=True)
