"""Activation checkpointing modes of ``get_peft_model(use_gradient_checkpointing=...)``.

* ``True``: checkpoint every decoder layer (non-reentrant): only each layer's input is kept for the backward,
  the layer is recomputed there.
* ``"slimrl"`` (default, ``"unsloth"`` is an alias): the same, and on CUDA the kept layer inputs live in pinned
  host memory, copied out and back on a side stream that overlaps the compute (:mod:`slimrl.models.offload`). On
  CPU the activations already live in host memory, so there is nothing to move: it is plain checkpointing.
* ``False``: no checkpointing.

The Trainer re-enables checkpointing from its config when it starts; the offload is installed on the model's own
``_set_gradient_checkpointing`` (see :func:`slimrl.models.offload.install`), so that re-enable keeps it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from slimrl.models import offload

logger = logging.getLogger(__name__)

OFFLOAD_MODES = ("slimrl", "unsloth")


def has_activation_checkpointing_enable() -> bool:
    """Whether the installed transformers has ``activation_checkpointing_enable`` (else the deprecated name)."""
    from transformers import PreTrainedModel

    return getattr(PreTrainedModel, "activation_checkpointing_enable", None) is not None


def wants_offload(mode: str | bool) -> bool:
    """``"slimrl"`` mode on a machine with CUDA."""
    return mode in OFFLOAD_MODES and torch.cuda.is_available()


def enable_checkpointing(model: Any, mode: str | bool) -> None:
    """Turn on the checkpointing ``mode`` on ``model`` (a PEFT or transformers model)."""
    if not mode:
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if wants_offload(mode):
        offload.install(base)
    elif mode in OFFLOAD_MODES:
        logger.info("use_gradient_checkpointing=%r: plain checkpointing (no CUDA device: activations already live "
                    "in host memory)", mode)
    turn_on(base)
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()


def turn_on(base: Any, every_n_layers: int = 1) -> None:
    """Non-reentrant checkpointing on a transformers model through its own API (``activation_checkpointing_enable``,
    or ``gradient_checkpointing_enable`` before transformers had it), then only every ``every_n_layers``-th decoder
    layer left checkpointed (what transformers' ``every_n_layers`` does where it exists)."""
    kwargs = {"use_reentrant": False}
    if has_activation_checkpointing_enable():
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if every_n_layers > 1:
        from transformers.modeling_layers import GradientCheckpointingLayer

        layers = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
        for i, layer in enumerate(layers):
            layer.gradient_checkpointing = i % every_n_layers == 0
