"""The settings slimrl changes in a TRL config, and the table that says so at trainer start.

slimrl's promise is TRL's behaviour: a TRL script trains, logs and saves the same with the patch. So the library
keeps every TRL default (``logging_steps``, precision, learning rate, batch, optimizer, seed, ...), with exactly two
exceptions, each listed in the changed-defaults table printed once when the trainer starts:

* ``bf16`` where TRL's own default cannot run: TRL >= 1.12 configs default to ``bf16=True``, which transformers
  refuses at config creation ("Your setup doesn't support bf16/gpu") on a machine without a bf16-capable
  accelerator unless ``use_cpu=True`` is passed. Scripts written for a GPU (Unsloth's notebooks pass no precision
  flags) would fail there; when the user passed none of ``bf16``, ``fp16``, ``use_cpu`` and no such device exists,
  the config is created with ``bf16=False`` (fp32 training, what transformers itself defaults to). On a CUDA GPU
  without bf16 in hardware (compute capability < 8: T4, V100), where transformers accepts bf16 because torch counts
  emulation, the same config trains in ``fp16`` with the loss scaler instead (Unsloth's choice there, and the
  precision vLLM runs on those cards). Everywhere else TRL's default runs (bf16 GPUs, XPU, MPS, or
  ``use_cpu=True``), it is kept.
* ``use_vllm`` when the user asked for slimrl's engine (``FastLanguageModel.from_pretrained(fast_inference=True)``;
  :func:`slimrl.patching.online.engine_hooks.apply_engine_defaults`).

And settings a script asks for that cannot run on this machine (scripts written for a GPU, TRL's argument parser
that passes every field): each becomes the nearest setting that runs, with its line in the same table —
``bf16=True`` without a bf16-capable accelerator (and without ``use_cpu``) -> False (fp32 training; ``fp16=True``
runs here, through accelerate, and is kept), a bitsandbytes optimizer (``adamw_8bit``, ``paged_adamw_8bit``, ...)
without a usable bitsandbytes -> ``adamw_torch``, ``use_liger_kernel=True`` (TRL's Liger switch) without a GPU
Triton runs on -> False (the model's torch layers; TRL's fused head stays); and, at trainer start,
``use_vllm=True`` without vLLM (and without slimrl's engine) -> False, generation with transformers
(:func:`slimrl.patching.online.engine_hooks.vllm_or_transformers`). Nothing is changed where the setting runs (a GPU
machine keeps every one), and ``SLIMRL_STRICT=1`` (or ``PatchFastRL(..., strict=True)``) keeps TRL's own refusals.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slimrl.compat.gpus import current_gpu, native_bf16
from slimrl.compat.runtime.env import env_flag
from slimrl.patching.every_trainer.state import config_state

# TRL's configs leave bf16 at None and resolve it to ``not fp16`` in ``__post_init__`` (trl/trainer/base_config.py).
_PRECISION_FLAGS = ("bf16", "fp16", "use_cpu")


def bf16_default_runs() -> bool:
    """Whether ``bf16=True`` without ``use_cpu`` passes transformers' own check here (the same predicate it uses in
    ``TrainingArguments.__post_init__``)."""
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    return bool(is_torch_bf16_gpu_available() or is_torch_xla_available())


_STRICT = {"on": False}  # PatchFastRL(strict=True)


def set_strict(on: bool) -> None:
    """``PatchFastRL(..., strict=True)``: keep TRL's refusals of settings this machine cannot run."""
    _STRICT["on"] = bool(on)


def strict() -> bool:
    return _STRICT["on"] or env_flag("SLIMRL_STRICT")


def apply_config_defaults(config_cls: type, kwargs: dict) -> tuple[dict, dict]:
    """(kwargs with slimrl's changed settings, {name: (the value asked for, slimrl's, as text)} of what changed):
    TRL's ``bf16`` default where it cannot run, and (unless strict) what a script asks for that cannot run here."""
    kwargs, changed = _trl_bf16_default(config_cls, kwargs)
    if not strict():
        kwargs, more = nearest_that_runs(config_cls, kwargs)
        changed.update(more)
    return kwargs, changed


def nearest_that_runs(config_cls: type, kwargs: dict) -> tuple[dict, dict]:
    """The module docstring's second list: settings the user passed that cannot run on this machine."""
    kwargs, changed = dict(kwargs), {}
    if kwargs.get("bf16") is True and not kwargs.get("use_cpu") and not bf16_default_runs():
        kwargs["bf16"] = False
        changed["bf16"] = (True, "False (no bf16-capable accelerator here: fp32 training)")
    optim = str(kwargs.get("optim") or "")
    if optim and _needs_bitsandbytes(optim) and not _bitsandbytes_usable():
        kwargs["optim"] = "adamw_torch"
        changed["optim"] = (optim, "adamw_torch (bitsandbytes is not usable here: pip install 'slimrl[quant]')")
    if kwargs.get("use_liger_kernel") is True and not liger_runs(bool(kwargs.get("use_cpu"))):
        kwargs["use_liger_kernel"] = False
        changed["use_liger_kernel"] = (
            True,
            "False (Liger's kernels are Triton, which runs on a CUDA or XPU GPU only: the model's own torch layers)",
        )
    return kwargs, changed


def liger_runs(use_cpu: bool) -> bool:
    """Whether Liger's Triton kernels can run for a config: a CUDA/XPU device it trains on and Triton importable
    (whether liger-kernel itself is installed is left to transformers' own error, which names the install)."""
    import importlib.util

    import torch

    gpu = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    return bool(gpu and not use_cpu and importlib.util.find_spec("triton") is not None)


def _needs_bitsandbytes(optim: str) -> bool:
    return "8bit" in optim or "bnb" in optim or optim.startswith("paged_")


def _bitsandbytes_usable() -> bool:
    from slimrl.compat.quant import bitsandbytes_works

    return bitsandbytes_works()


def _trl_bf16_default(config_cls: type, kwargs: dict) -> tuple[dict, dict]:
    """TRL's own ``bf16=True`` default where it cannot run (first item of the module docstring)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    # a flag at its default counts as not passed: TRL's argument parser passes every field
    if "bf16" not in defaults or any(k in kwargs and kwargs[k] != defaults.get(k) for k in _PRECISION_FLAGS):
        return kwargs, {}
    trl_bf16 = defaults["bf16"] is None or defaults["bf16"] is True  # None: TRL resolves it to True (fp16 unset)
    if not trl_bf16 or defaults.get("fp16") or defaults.get("use_cpu"):
        return kwargs, {}
    gpu = current_gpu()
    if gpu is not None and not native_bf16():
        why = (
            f"the {gpu.name} has no bf16 in hardware (compute capability {gpu.capability[0]}.{gpu.capability[1]}; "
            f"torch counts emulation): fp16 with the loss scaler, as Unsloth trains there"
        )
        return {**kwargs, "bf16": False, "fp16": True}, {"bf16": (True, f"False ({why})"), "fp16": (False, "True")}
    if bf16_default_runs():
        return kwargs, {}
    return {**kwargs, "bf16": False}, {
        "bf16": (True, "False (no bf16-capable accelerator; TRL's default would fail here without use_cpu=True)")
    }


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
    print(
        f"slimrl: settings changed in {type(config).__name__} (asked for -> what runs here; SLIMRL_STRICT=1 "
        f"keeps what was asked):\n{rows}",
        flush=True,
    )
