"""Activation checkpointing modes of ``get_peft_model(use_gradient_checkpointing=...)``.

* ``True``: checkpoint every decoder layer (non-reentrant): only each layer's input is kept for the backward,
  the layer is recomputed there.
* ``"slimrl"`` (default, ``"unsloth"`` is an alias): the same, and on CUDA the kept layer inputs live in pinned
  host memory (copied out in the forward, back in the backward) through transformers' own
  ``activation_checkpointing_enable(offload=True)``. On CPU the activations already live in host memory, so there
  is nothing to move: it is plain checkpointing (transformers' offload also refuses to run without an accelerator).
* ``False``: no checkpointing.

The Trainer re-enables checkpointing from its config when it starts; :func:`align_trainer_checkpointing` writes the
offload choice into that config (``activation_checkpointing_kwargs["offload"]``) so the two agree.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

OFFLOAD_MODES = ("slimrl", "unsloth")


def offload_supported() -> bool:
    """Whether the installed transformers can offload checkpointed activations (``offload=`` argument)."""
    from transformers import PreTrainedModel

    enable = getattr(PreTrainedModel, "activation_checkpointing_enable", None)
    return enable is not None and "offload" in inspect.signature(enable).parameters


def wants_offload(mode: str | bool) -> bool:
    """``"slimrl"`` mode on a machine with CUDA and a transformers that supports offload."""
    return mode in OFFLOAD_MODES and torch.cuda.is_available() and offload_supported()


def enable_checkpointing(model: Any, mode: str | bool) -> None:
    """Turn on the checkpointing ``mode`` on ``model`` (a PEFT or transformers model)."""
    if not mode:
        return
    offload = wants_offload(mode)
    if mode in OFFLOAD_MODES and not offload:
        reason = "no CUDA device: activations already live in host memory" if not torch.cuda.is_available() \
            else "this transformers has no activation offloading"
        logger.info("use_gradient_checkpointing=%r: plain checkpointing (%s)", mode, reason)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if offload_supported():
        base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False},
                                             offload=offload)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()


def align_trainer_checkpointing(model: Any, args: Any) -> None:
    """Make the Trainer's own (re-)enabling of checkpointing keep the offload chosen in ``get_peft_model``."""
    mode = getattr(model, "slimrl_config", {}).get("gradient_checkpointing")
    if args is None or not wants_offload(mode):
        return
    name = "activation_checkpointing_kwargs" if hasattr(args, "activation_checkpointing_kwargs") \
        else "gradient_checkpointing_kwargs"
    on = getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", False)
    if not on:
        return
    kwargs = dict(getattr(args, name, None) or {})
    kwargs.setdefault("offload", True)
    for attr in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        if hasattr(args, attr):
            setattr(args, attr, kwargs)
