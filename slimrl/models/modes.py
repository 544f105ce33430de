"""Inference / training mode switching that can be undone exactly.

``for_inference(model)`` records the model's training state, then: ``eval()`` (dropout off; bitsandbytes' quantized
layers keep computing as in training, see :mod:`slimrl.models.quantized`), KV cache on
(``config.use_cache = True``), activation checkpointing off, and left padding on the tokenizer that
``FastLanguageModel.from_pretrained`` returned (decoder-only generation needs it).
``for_training(model)`` puts back exactly what ``for_inference`` recorded: the ``training`` flag of every
submodule, ``use_cache``, checkpointing (with the same checkpoint function), ``requires_grad`` of every parameter
and the tokenizer's padding side. Called without a prior ``for_inference`` it sets the usual training state:
``train()``, ``use_cache = False``, checkpointing back on if ``get_peft_model`` turned it on.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from slimrl.compat.model_state import model_state
from slimrl.models.quantized import keep_8bit_training_mode, keep_quantized_trainable

_STATE = "_slimrl_saved_training_state"
_IN_STEP: ContextVar[bool] = ContextVar("slimrl_trainer_step", default=False)
_SWITCH_LOCK = threading.RLock()  # held by a generation that switched a model's modes, and to count steps
_STEPS = [0]  # trainer steps running now, in every thread


@contextmanager
def trainer_step() -> Iterator[None]:
    """A patched trainer's step runs: generation inside it keeps the trainer's own settings (``generate`` below),
    and no other thread switches a model's modes until it ends (:func:`switch_window`); a step that starts while
    another thread's generation has the model switched waits for it to switch back."""
    token = _IN_STEP.set(True)
    with _SWITCH_LOCK:
        _STEPS[0] += 1
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            _STEPS[0] -= 1
        _IN_STEP.reset(token)


@contextmanager
def switch_window() -> Iterator[bool]:
    """Yields whether this thread may switch a model to inference mode and back now: not while a trainer step runs
    in any thread (``model.generate`` from a second thread would flip the mode under the step's forward and its
    checkpoint recompute); while the window is held, a step starting in another thread waits."""
    _SWITCH_LOCK.acquire()
    if _STEPS[0]:
        _SWITCH_LOCK.release()
        yield False
        return
    try:
        yield True
    finally:
        _SWITCH_LOCK.release()


def in_trainer_step() -> bool:
    return _IN_STEP.get()


@dataclass
class TrainingState:
    training: dict[str, bool]  # module name -> .training
    requires_grad: dict[str, bool]  # parameter name -> .requires_grad
    use_cache: bool | None
    checkpointing: dict[str, tuple[bool, Any]]  # module name -> (gradient_checkpointing, its checkpoint function)
    padding_side: str | None


def _base(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _tokenizer(model: torch.nn.Module):
    return model_state(model).tokenizer


def _checkpointing_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    return {n: m for n, m in model.named_modules() if hasattr(m, "gradient_checkpointing")}


def capture(model: torch.nn.Module) -> TrainingState:
    tok = _tokenizer(model)
    return TrainingState(
        training={n: m.training for n, m in model.named_modules()},
        requires_grad={n: p.requires_grad for n, p in model.named_parameters()},
        use_cache=getattr(_base(model).config, "use_cache", None),
        checkpointing={
            n: (bool(m.gradient_checkpointing), getattr(m, "_gradient_checkpointing_func", None))
            for n, m in _checkpointing_modules(model).items()
        },
        padding_side=getattr(tok, "padding_side", None),
    )


def restore(model: torch.nn.Module, state: TrainingState) -> None:
    modules = dict(model.named_modules())
    for name, flag in state.training.items():
        if name in modules:
            modules[name].training = flag
    for name, p in model.named_parameters():
        if name in state.requires_grad:
            p.requires_grad_(state.requires_grad[name])
    if state.use_cache is not None:
        _base(model).config.use_cache = state.use_cache
    for name, (flag, func) in state.checkpointing.items():
        if name in modules:
            modules[name].gradient_checkpointing = flag
            if func is not None:
                modules[name]._gradient_checkpointing_func = func
    tok = _tokenizer(model)
    if tok is not None and state.padding_side is not None:
        tok.padding_side = state.padding_side


def in_inference_mode(model: Any) -> bool:
    """Whether :func:`for_inference` switched ``model`` and :func:`for_training` has not switched it back."""
    return getattr(model, _STATE, None) is not None


def for_inference(model: Any) -> Any:
    """Switch ``model`` to generation mode; :func:`for_training` undoes it exactly. Returns ``model``."""
    if getattr(model, _STATE, None) is None:  # nested calls keep the outermost training state
        setattr(model, _STATE, capture(model))
    keep_quantized_trainable(model)  # no 4-bit CPU repacking (its kernel has no gradient)
    model.eval()
    keep_8bit_training_mode(model)  # 8-bit layers sample from the numbers training scores
    _base(model).config.use_cache = True
    for m in _checkpointing_modules(model).values():
        m.gradient_checkpointing = False
    tok = _tokenizer(model)
    if tok is not None:
        tok.padding_side = "left"
    return model


def for_training(model: Any) -> Any:
    """Switch ``model`` back to training mode (exactly as before :func:`for_inference`). Returns ``model``."""
    state = getattr(model, _STATE, None)
    if state is not None:
        restore(model, state)
        setattr(model, _STATE, None)
        return model
    model.train()
    _base(model).config.use_cache = False
    if model_state(model).checkpointing:
        for m in _checkpointing_modules(model).values():
            if getattr(m, "_gradient_checkpointing_func", None) is not None:
                m.gradient_checkpointing = True
    return model
