"""Liger-Kernel's RMSNorm and rotary embedding (and its SwiGLU where slimrl's fused MLP does not serve) on a model,
reversibly (Liger-Kernel: Hsu et al. 2024, arXiv:2410.10989: Triton kernels that fuse each op's elementwise
passes into one, forward and backward).

Liger is a dependency, not a copy: its own ``_apply_liger_kernel_to_instance`` applies it, with the families it
knows (``MODEL_TYPE_TO_APPLY_LIGER_FN``, keyed by ``config.model_type``); a model it does not know keeps
transformers' modules. Liger's cross-entropy and fused linear cross-entropy are never asked for: slimrl's chunked
head computes the log-probs.

What Liger changes is restored exactly by :func:`remove_liger`: it rebinds names in transformers' modeling modules
(``apply_rotary_pos_emb``, the norm and MLP classes) and sets attributes on the model's module instances (their
``forward``, ``extra_repr``, the norm's casting mode); the entries it changed (found by comparing both before and
after it runs) get their earlier values back, and nothing else is touched.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch

from slimrl.compat.liger import liger_installed

KERNELS = ("rms_norm", "rope")  # the kernels slimrl asks Liger for, by Liger's keyword
MLP_KERNELS = ("swiglu", "geglu")  # Liger's gated-MLP kernels (a family's apply function takes one of them)
_APPLIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (kernels, snapshot)


def liger_families() -> frozenset[str]:
    """The ``model_type``s Liger knows (empty where Liger is not installed, or does not import here: it needs
    Triton)."""
    if not liger_installed():
        return frozenset()
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        return frozenset()
    return frozenset(MODEL_TYPE_TO_APPLY_LIGER_FN)


def _transformers_model(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _snapshot(model: Any) -> tuple[list, list]:
    """The instance dictionaries of ``model``'s modules and the namespaces of transformers' modeling modules."""
    modules = [(m, dict(vars(m))) for m in model.modules()]
    namespaces = [
        (module, dict(vars(module)))
        for name, module in list(sys.modules.items())
        if name.startswith("transformers.models.") and name.rsplit(".", 1)[-1].startswith("modeling_")
    ]
    return modules, namespaces


_MISSING = object()


def _changes(before: tuple[list, list]) -> list[tuple[Any, dict]]:
    """What Liger changed since ``before``: per holder, each changed key's earlier value (``_MISSING``: added)."""
    changes = []
    for holder, old in (*before[0], *before[1]):
        now = vars(holder)
        keys = set(now) | set(old)
        changed = {k: old.get(k, _MISSING) for k in keys if now.get(k, _MISSING) is not old.get(k, _MISSING)}
        if changed:
            changes.append((holder, changed))
    return changes


def _restore(changes: list[tuple[Any, dict]]) -> None:
    for holder, changed in changes:
        now = vars(holder)
        for key, value in changed.items():
            if value is _MISSING:
                now.pop(key, None)
            else:
                now[key] = value


def apply_liger(model: Any, swiglu: bool) -> tuple[str, ...]:
    """Liger's RMSNorm and RoPE, and with ``swiglu`` its gated MLP (SwiGLU, GeGLU for Gemma), on ``model`` (a PEFT
    model: its transformers model) and its family's modeling module; returns the kernels applied (none where Liger
    is missing or does not know the family). Again on the same model: nothing changes."""
    target = _transformers_model(model)
    if target in _APPLIED:
        return _APPLIED[target][0]
    model_type = getattr(getattr(target, "config", None), "model_type", None)
    if model_type not in liger_families():
        return ()
    import inspect

    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel_to_instance

    takes = inspect.signature(MODEL_TYPE_TO_APPLY_LIGER_FN[model_type]).parameters
    asked = {**{k: True for k in KERNELS}, **{k: swiglu for k in MLP_KERNELS}}
    kernels = tuple(k for k, on in asked.items() if on and k in takes)
    before = _snapshot(target)
    try:
        _apply_liger_kernel_to_instance(target, cross_entropy=False, fused_linear_cross_entropy=False, **asked)
    finally:
        changes = _changes(before)
    _APPLIED[target] = (kernels, changes)
    return kernels


def remove_liger(model: Any) -> None:
    """Undo :func:`apply_liger` on ``model``: transformers' modules and functions as they were."""
    entry = _APPLIED.pop(_transformers_model(model), None)
    if entry is not None:
        _restore(entry[1])


def remove_all() -> None:
    """Undo :func:`apply_liger` on every model it was applied to, the last first."""
    for model in reversed(list(_APPLIED.keys())):
        remove_liger(model)


def active_liger(model: Any) -> tuple[str, ...]:
    """The Liger kernels :func:`apply_liger` put on ``model`` (none: not applied)."""
    entry = _APPLIED.get(_transformers_model(model))
    return entry[0] if entry else ()


def wanted(model: Any, args: Any) -> bool:
    """Whether slimrl applies Liger to a trainer's ``model``: on CUDA, with Liger installed, unless the config asks
    TRL to apply Liger itself (``use_liger_kernel=True``)."""
    return _on_cuda(model) and liger_installed() and not getattr(args, "use_liger_kernel", False)


def _on_cuda(model: Any) -> bool:
    return isinstance(model, torch.nn.Module) and any(p.device.type == "cuda" for p in model.parameters())
