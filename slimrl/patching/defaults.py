"""The one default slimrl changes in a TRL config, and the table that says so at trainer start.

slimrl's promise is TRL's behaviour: a TRL script trains, logs and saves the same with the patch. So the library
keeps every TRL default (``logging_steps``, precision, learning rate, batch, optimizer, seed, ...), with exactly two
exceptions, each listed in the changed-defaults table printed once when the trainer starts:

* ``bf16`` where TRL's own default cannot run: TRL >= 1.12 configs default to ``bf16=True``, which transformers
  refuses at config creation ("Your setup doesn't support bf16/gpu") on a machine without a bf16-capable
  accelerator unless ``use_cpu=True`` is passed. Scripts written for a GPU (Unsloth's notebooks pass no precision
  flags) would fail there; when the user passed none of ``bf16``, ``fp16``, ``use_cpu`` and no such device exists,
  the config is created with ``bf16=False`` (fp32 training, what transformers itself defaults to). Everywhere TRL's
  default runs (CUDA, XPU, MPS, or ``use_cpu=True``), it is kept.
* ``use_vllm`` when the user asked for slimrl's engine (``FastLanguageModel.from_pretrained(fast_inference=True)``;
  :func:`slimrl.patching.online.engine_hooks.apply_engine_defaults`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slimrl.patching.state import config_state

# TRL's configs leave bf16 at None and resolve it to ``not fp16`` in ``__post_init__`` (trl/trainer/base_config.py).
_PRECISION_FLAGS = ("bf16", "fp16", "use_cpu")


def bf16_default_runs() -> bool:
    """Whether ``bf16=True`` without ``use_cpu`` passes transformers' own check here (the same predicate it uses in
    ``TrainingArguments.__post_init__``)."""
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    return bool(is_torch_bf16_gpu_available() or is_torch_xla_available())


def apply_config_defaults(config_cls: type, kwargs: dict) -> tuple[dict, dict]:
    """(kwargs with slimrl's changed defaults filled in, {name: (TRL's default, slimrl's)} of what changed)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    if "bf16" not in defaults or any(k in kwargs for k in _PRECISION_FLAGS):
        return kwargs, {}
    trl_bf16 = defaults["bf16"] is None or defaults["bf16"] is True  # None: TRL resolves it to True (fp16 unset)
    if not trl_bf16 or defaults.get("fp16") or defaults.get("use_cpu") or bf16_default_runs():
        return kwargs, {}
    return {**kwargs, "bf16": False}, {"bf16": (True, "False (no bf16-capable accelerator; TRL's default would "
                                                       "fail here without use_cpu=True)")}


def record_explicit(config: Any, kwargs: dict, changed: dict) -> None:
    """Remember which keywords the user passed and what slimrl changed (read at trainer start)."""
    state = config_state(config)
    state.explicit = frozenset(kwargs) - set(changed)
    state.changed = dict(changed)


def print_changed_defaults(config: Any) -> None:
    """One short table of the defaults slimrl changed for this config (main process only, once per config)."""
    if config is None:
        return
    state = config_state(config)
    changed = state.changed
    if not changed or state.defaults_printed:
        return
    state.defaults_printed = True
    if getattr(config, "process_index", 0) != 0:
        return
    width = max(len(n) for n in changed)
    rows = "\n".join(f"  {n:<{width}}  {old!s} -> {new!s}" for n, (old, new) in changed.items())
    print(f"slimrl: defaults changed (pass them to {type(config).__name__} to keep TRL's):\n{rows}", flush=True)
