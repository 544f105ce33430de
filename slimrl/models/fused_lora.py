"""Fused LoRA: a PEFT model's LoRA projections computed by slimrl's ops, the same math with less traffic and memory.

* Every LoRA ``Linear`` (attention's q/k/v/o, anything PEFT wrapped) adds its low-rank product into the base
  output in the activation's dtype (:mod:`slimrl.ops.lora_linear`): no fp32 copy of the activation, no
  ``[tokens, out]`` temporaries.
* A gated MLP whose gate, up and down projections all carry LoRA runs as one autograd Function
  (:mod:`slimrl.ops.fused_mlp`) that saves its input and the gate/up outputs only.

Each call checks that it can serve it, else runs PEFT's own forward: adapters disabled (TRL's reference pass under
``disable_adapter()``), merged, more than one active adapter, a variant (DoRA), a bias on ``lora_B``, dropout that is
not ``nn.Dropout``, extra arguments (PEFT's mixed-adapter batches); for the MLP also a base layer that is neither
``nn.Linear`` nor bitsandbytes' ``Linear4bit``, or base weights that train. An MLP is fused only when it has the
gated shape (``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``) and a probe finds the fused forward equal to the
module's own on random rows; a module that fails the probe keeps PEFT's path, with one line. A ``modules_to_save``
layer is not a LoRA layer: PEFT's wrapper runs it.

Forwards are methods bound to their modules (no closure), so a ``copy.deepcopy`` of the model (TRL's reference
copy) binds them to the copy. :func:`unfuse_lora` puts PEFT's forwards back.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from slimrl.compat.quant import dense_weight, has_dense_weight
from slimrl.compat.runtime.callsite import warn
from slimrl.models.tiled_mlp import ATTR as TILED
from slimrl.ops.fused_mlp import GatedSpec, Projection, gated_lora_mlp
from slimrl.ops.lora_linear import lora_add

LINEAR_ATTR = "slimrl_fused_lora"  # set on a LoRA layer whose forward is the fused one
MLP_ATTR = "slimrl_fused_mlp"  # set on a fused MLP
INNER = "slimrl_inner_forward"  # a tiled MLP's forward per tile (slimrl.models.tiled_mlp)
_OWN = "slimrl_unfused_forward"  # a forward set on the instance before fusing (kept, run where not served)
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _lora_layers(model: Any) -> list[torch.nn.Module]:
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer) and hasattr(m, "base_layer")]


def _adapter(layer: Any) -> str | None:
    """The one active vanilla adapter a fused forward can serve on ``layer`` now, else None (module docstring)."""
    if getattr(layer, "disable_adapters", False) or getattr(layer, "merged", False):
        return None
    active = [a for a in layer.active_adapters if a in layer.lora_A]
    if len(active) != 1:
        return None
    name = active[0]
    if name in getattr(layer, "lora_variant", {}) or getattr(layer, "use_dora", {}).get(name, False):
        return None
    if getattr(layer, "lora_bias", {}).get(name, False) or getattr(layer.lora_B[name], "bias", None) is not None:
        return None
    if not isinstance(layer.lora_A[name], torch.nn.Linear) or not isinstance(layer.lora_B[name], torch.nn.Linear):
        return None
    if not isinstance(layer.lora_dropout[name], torch.nn.Dropout | torch.nn.Identity):
        return None
    return name


def _dropout(layer: Any, name: str) -> tuple[float, bool]:
    drop = layer.lora_dropout[name]
    return (float(drop.p), bool(drop.training)) if isinstance(drop, torch.nn.Dropout) else (0.0, False)


def _peft_forward(module: Any, *args: Any, **kwargs: Any) -> Any:
    own = module.__dict__.get(_OWN)
    return own(*args, **kwargs) if own is not None else type(module).forward(module, *args, **kwargs)


def fused_linear_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A LoRA layer's forward: base output plus the low-rank product (:func:`slimrl.ops.lora_linear.lora_add`)."""
    name = None if args or kwargs else _adapter(self)
    if name is None:
        return _peft_forward(self, x, *args, **kwargs)
    p, training = _dropout(self, name)
    y = self.base_layer(x)  # [..., out]
    return lora_add(y, x, self.lora_A[name].weight, self.lora_B[name].weight, self.scaling[name], p, training)


def _spec(mlp: Any) -> tuple[tuple[torch.Tensor, ...], GatedSpec] | None:
    """The fused MLP's adapters and spec for ``mlp`` now, or None where it cannot serve this call."""
    layers = [getattr(mlp, n, None) for n in PROJECTIONS]
    names = [_adapter(layer) if getattr(layer, LINEAR_ATTR, False) else None for layer in layers]
    if None in names or len({_dropout(layer, n) for layer, n in zip(layers, names, strict=True)}) != 1:
        return None
    projections, adapters = [], []
    for layer, name in zip(layers, names, strict=True):
        base = layer.base_layer
        if not has_dense_weight(base) or any(t.requires_grad for t in base.parameters()):
            return None
        projections.append(Projection(_forward_of(base), _weight_of(base), float(layer.scaling[name])))
        adapters += [layer.lora_A[name].weight, layer.lora_B[name].weight]
    p, training = _dropout(layers[0], names[0])
    return tuple(adapters), GatedSpec(*projections, act=mlp.act_fn, p=p, training=training)


def _weight_of(base: Any) -> Any:
    return lambda dtype: dense_weight(base, dtype)


def _forward_of(base: Any) -> Any:
    """The base's forward on an input in its compute dtype: an ``nn.Linear``'s weights cast to it (as autocast casts
    them), bitsandbytes' layer as it is (it casts for itself)."""
    if type(base) is not torch.nn.Linear:
        return base

    def linear(x: torch.Tensor) -> torch.Tensor:
        bias = None if base.bias is None else base.bias.to(x.dtype)
        return torch.nn.functional.linear(x, base.weight.to(x.dtype), bias)

    return linear


def fused_mlp_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A gated MLP's forward through :func:`slimrl.ops.fused_mlp.gated_lora_mlp` where it serves (module docstring)."""
    spec = None if args or kwargs else _spec(self)
    if spec is None:
        return _peft_forward(self, x, *args, **kwargs)
    return gated_lora_mlp(x, *spec)


def _gated(module: Any) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Module) for n in (*PROJECTIONS, "act_fn"))


def _bind(module: Any, forward: Any, attr: str) -> None:
    """``forward`` bound as the module's forward; on a tiled MLP as the forward its tiles run
    (:mod:`slimrl.models.tiled_mlp`), so tiling stays outside."""
    slot = INNER if hasattr(module, TILED) else "forward"
    if slot in vars(module):
        module.__dict__[_OWN] = vars(module)[slot]
    module.__dict__[slot] = types.MethodType(forward, module)
    setattr(module, attr, True)


def _ours(method: Any) -> bool:
    return getattr(method, "__func__", None) in (fused_linear_forward, fused_mlp_forward)


def fuse_lora(model: Any) -> tuple[int, int]:
    """Fuse ``model``'s LoRA layers and gated MLPs (module docstring); returns (LoRA layers, MLPs) fused. Again on a
    fused model: nothing changes."""
    layers = _lora_layers(model)
    for layer in layers:
        if not getattr(layer, LINEAR_ATTR, False):
            _bind(layer, fused_linear_forward, LINEAR_ATTR)
    mlps = 0
    for name, module in model.named_modules():
        if getattr(module, MLP_ATTR, False):
            mlps += 1
        elif _gated(module) and getattr(module.gate_proj, LINEAR_ATTR, False) and _spec(module) is not None:
            if _probe(module):
                _bind(module, fused_mlp_forward, MLP_ATTR)
                mlps += 1
            else:
                warn(f"fused LoRA: {name} ({type(module).__name__}) is not down(act(gate(x)) * up(x)); PEFT runs it")
    return len(layers), mlps


def unfuse_lora(model: Any) -> None:
    """Undo :func:`fuse_lora`: PEFT's forwards (or the ones set before) again."""
    for module in model.modules():
        if getattr(module, LINEAR_ATTR, False) or getattr(module, MLP_ATTR, False):
            own = module.__dict__.pop(_OWN, None)
            for slot in ("forward", INNER):
                if _ours(vars(module).get(slot)):
                    del module.__dict__[slot]
                    if own is not None:
                        module.__dict__[slot] = own
            for attr in (LINEAR_ATTR, MLP_ATTR):
                module.__dict__.pop(attr, None)


def is_fused(model: Any) -> bool:
    """Whether any layer of ``model`` runs a fused forward."""
    return any(getattr(m, LINEAR_ATTR, False) for m in model.modules())


def _probe(mlp: Any) -> bool:
    """Three random rows through the fused forward equal the module's own (PEFT's) forward: the module computes
    ``down(act(gate(x)) * up(x))``. Weights on the meta device are taken as declared."""
    weight = mlp.gate_proj.lora_A[_adapter(mlp.gate_proj)].weight
    if weight.device.type == "meta":
        return True
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, weight.shape[1], generator=gen).to(device=weight.device, dtype=_activation_dtype(mlp))
    state = [(m, m.training) for m in mlp.modules() if isinstance(m, torch.nn.Dropout)]
    for m, _ in state:  # no dropout in the probe; the rest keeps its mode (a 4-bit base repacks in eval mode)
        m.training = False
    try:
        with torch.no_grad():
            ours = gated_lora_mlp(x, *_spec(mlp)).float()
            theirs = mlp(x).float()  # not fused yet: the module's own forward (one set on the instance included)
    except Exception:  # noqa: BLE001 - a module the fused forward cannot run keeps PEFT's
        return False
    finally:
        for m, mode in state:
            m.training = mode
    scale = theirs.abs().max().clamp_min(1e-6)
    tol = 1e-4 if x.dtype == torch.float32 else 5e-2
    return ours.shape == theirs.shape and bool(((ours - theirs).abs().max() / scale) <= tol)


def _activation_dtype(mlp: Any) -> torch.dtype:
    base = mlp.gate_proj.base_layer
    if type(base) is torch.nn.Linear:
        return base.weight.dtype
    return getattr(base, "compute_dtype", None) or torch.float32
