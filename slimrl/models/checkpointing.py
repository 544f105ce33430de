"""Activation checkpointing modes of ``get_peft_model(use_gradient_checkpointing=...)``.

* ``True``: checkpoint every decoder layer (non-reentrant): only each layer's input is kept for the backward,
  the layer is recomputed there.
* ``"slimrl"`` (default, ``"unsloth"`` is an alias): the same, and on CUDA the kept layer inputs live in pinned
  host memory, copied out and back on a side stream that overlaps the compute (:mod:`slimrl.models.offload`). On
  CPU the activations already live in host memory, so there is nothing to move: it is plain checkpointing.
* ``"selective"``: only every ``checkpoint_every_n_layers``-th decoder layer (default 2) is checkpointed, the others
  keep their activations: less recompute for more memory (what ``slimrl plan --budget`` picks when it fits).
* ``False``: no checkpointing.

The Trainer re-enables checkpointing from its config when it starts (every layer, no offload). The policy is kept by
:func:`install_policy`: it wraps the model's own ``_set_gradient_checkpointing`` (transformers' one place that hands
every layer its checkpoint function and flag, since 4.35) on the instance, so every later enable gets the offload
and the layer selection; :func:`uninstall_policy` restores transformers' behaviour.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from slimrl.models import offload as offload_module

logger = logging.getLogger(__name__)

OFFLOAD_MODES = ("slimrl", "unsloth")
MODES = ("slimrl", "unsloth", "selective", True, False)


def has_activation_checkpointing_enable() -> bool:
    """Whether the installed transformers has ``activation_checkpointing_enable`` (else the deprecated name)."""
    from transformers import PreTrainedModel

    return getattr(PreTrainedModel, "activation_checkpointing_enable", None) is not None


def wants_offload(mode: str | bool) -> bool:
    """``"slimrl"`` mode on a machine with CUDA."""
    return mode in OFFLOAD_MODES and torch.cuda.is_available()


def enable_checkpointing(model: Any, mode: str | bool, every_n_layers: int = 2) -> None:
    """Turn on the checkpointing ``mode`` on ``model`` (a PEFT or transformers model); ``every_n_layers`` is the
    period of ``"selective"``."""
    if not mode:
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    every = every_n_layers if mode == "selective" else 1
    if wants_offload(mode) or every > 1:
        install_policy(base, offload=wants_offload(mode), every_n_layers=every)
    if mode in OFFLOAD_MODES and not wants_offload(mode):
        logger.info(
            "use_gradient_checkpointing=%r: plain checkpointing (no CUDA device: activations already live "
            "in host memory)",
            mode,
        )
    turn_on(base, every)
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
        _select_layers(base, every_n_layers)


def _select_layers(base: Any, every_n_layers: int) -> None:
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in base.modules() if isinstance(m, GradientCheckpointingLayer)]
    for i, layer in enumerate(layers):
        layer.gradient_checkpointing = i % every_n_layers == 0


def install_policy(base: Any, *, offload: bool, every_n_layers: int = 1) -> offload_module.Offloader | None:
    """Keep slimrl's checkpointing policy through every later enable of ``base`` (see the module docstring);
    returns the offloader when ``offload``. Idempotent: a second call replaces the first policy."""
    uninstall_policy(base)
    offloader = offload_module.Offloader() if offload else None
    original = base._set_gradient_checkpointing  # bound method of the class

    @functools.wraps(original)
    def set_gradient_checkpointing(enable: bool = True, gradient_checkpointing_func: Any = None, **kwargs: Any) -> Any:
        if enable and gradient_checkpointing_func is not None and offloader is not None:
            gradient_checkpointing_func = offload_module.offloaded(gradient_checkpointing_func, offloader)
        if gradient_checkpointing_func is None:
            result = original(enable=enable, **kwargs)
        else:
            result = original(enable=enable, gradient_checkpointing_func=gradient_checkpointing_func, **kwargs)
        if enable and every_n_layers > 1:
            _select_layers(base, every_n_layers)
        return result

    set_gradient_checkpointing.slimrl_offloader = offloader
    base._set_gradient_checkpointing = set_gradient_checkpointing
    return offloader


def uninstall_policy(base: Any) -> None:
    """Back to transformers' own checkpointing at the next enable."""
    base.__dict__.pop("_set_gradient_checkpointing", None)


def is_on(base: Any) -> bool:
    """Whether ``base`` (a transformers model) checkpoints, asked by the name the installed transformers keeps
    (``is_activation_checkpointing``; ``is_gradient_checkpointing`` before it had one, deprecated since)."""
    return bool(
        base.is_activation_checkpointing if has_activation_checkpointing_enable() else base.is_gradient_checkpointing
    )


def _disable(base: Any) -> None:
    if has_activation_checkpointing_enable():
        base.activation_checkpointing_disable()
    else:
        base.gradient_checkpointing_disable()


def turn_off(model: Any) -> None:
    """No checkpointing on ``model`` (PEFT or transformers), slimrl's policy removed, through transformers' API."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    uninstall_policy(base)
    if is_on(base):
        _disable(base)


@contextmanager
def paused(model: Any, kwargs: dict | None = None) -> Iterator[None]:
    """Checkpointing off for the block (a no-grad pass) and back on after with ``kwargs`` (the config's
    ``gradient_checkpointing_kwargs``), through transformers' current names: what TRL's
    ``disable_gradient_checkpointing`` does, without the names transformers deprecates (its FutureWarnings)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    was = is_on(base)
    if was:
        _disable(base)
    try:
        yield
    finally:
        if was and has_activation_checkpointing_enable():
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        elif was:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
