"""Tiled MLP: each decoder layer's MLP runs a tile of tokens at a time, and with gradients each tile is checkpointed,
so the layer's MLP intermediates exist for one tile instead of the whole micro-batch (Unsloth's
``unsloth_tiled_mlp=True``; TiledMLP of Arctic Long Sequence Training, Bekman et al. 2025, arXiv:2506.13996).

Why it saves memory: with checkpointing, the backward recomputes one decoder layer at a time over every token of
the micro-batch; a gated MLP's gate, up, activation and product (``[tokens, intermediate]`` each, plus their
gradients) are most of that recompute at long lengths. The MLP is position-wise, so ``mlp(x)`` row by row equals
``mlp`` over the tile's rows: the outputs are the same numbers, and the weight gradients are the same sums taken
tile by tile (so equal up to floating-point summation order). The price is one more forward of the MLP per layer
(each tile is recomputed in the backward).

A module is tiled when its attribute name is ``mlp``, its class name ends in ``MLP`` and it has no ``experts``
(a mixture of experts routes over the whole batch and returns more than a tensor): dense MLPs of Llama, Qwen2/3,
Gemma, Mistral, SmolLM — and a probe finds it position-wise (three random rows at once give what each gives alone;
a module that mixes positions is left untiled, with one line). A call with anything but one hidden-state tensor goes
to the module's own forward; a module whose output is not one row per input row (a tuple, another shape: not
position-wise) is left untiled, with one line.

The tiled forward is a method bound to its module (no closure over it): a copy of the model (``copy.deepcopy``,
which TRL's ``create_reference_model`` makes for a frozen reference) binds it to the copy, so the copy computes with
its own weights.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from slimrl.compat.runtime.callsite import warn

ATTR = "slimrl_tiled_rows"  # set on a tiled module: the rows of a tile


def tiled_modules(model: Any) -> list[torch.nn.Module]:
    """The dense MLP modules of ``model`` that tiling applies to (module docstring)."""
    return [
        m
        for name, m in model.named_modules()
        if name.rsplit(".", 1)[-1] == "mlp" and type(m).__name__.endswith("MLP") and not hasattr(m, "experts")
    ]


def tile_rows(model: Any) -> int:
    """Rows per tile: the hidden size (Arctic's rule: about ``tokens / hidden_size`` tiles), at least 256."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    return max(256, int(getattr(config, "hidden_size", 0) or 0))


def tile_mlp(model: Any, rows: int | None = None) -> int:
    """Run every dense MLP of ``model`` (and its PEFT wrapper) ``rows`` tokens at a time (default
    :func:`tile_rows`); returns how many modules were tiled. Again on a tiled model: only the rows change."""
    if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows < 1):
        raise ValueError(f"rows={rows!r}: the tokens of one MLP tile, a positive int (None: the hidden size)")
    rows = rows or tile_rows(model)
    modules = [m for m in tiled_modules(model) if hasattr(m, ATTR) or _position_wise(m)]
    for module in modules:
        if not hasattr(module, ATTR):
            if "forward" in vars(module):  # a forward set on the instance before: tiles run it
                module.slimrl_inner_forward = module.forward
            module.forward = types.MethodType(tiled_forward, module)
        setattr(module, ATTR, rows)
    return len(modules)


def _position_wise(module: torch.nn.Module) -> bool:
    """A probe before tiling: three random rows through the module at once equal each row through it alone (a
    module that mixes positions would compute other numbers tile by tile); False, with one line, where they do not.
    Modules whose weights are not materialised (meta) or whose input width is unknown are taken as declared."""
    params = [p for p in module.parameters() if p.is_floating_point()]
    width = next((m.in_features for m in module.modules() if isinstance(getattr(m, "in_features", None), int)), None)
    if not params or width is None or params[0].device.type == "meta":
        return True
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, width, generator=gen).to(device=params[0].device, dtype=params[0].dtype)  # [3, H]
    with torch.no_grad():
        try:
            together = _own(module)(x)  # [3, H]
            alone = torch.cat([_own(module)(x[i : i + 1]) for i in range(3)])  # [3, H]
        except Exception:  # noqa: BLE001 - a module that cannot take rows: judged at its first call
            return True
    if not isinstance(together, torch.Tensor) or together.shape != alone.shape:
        return True  # not one tensor of rows: the tiled forward's own check stands it aside at its first call
    scale = float(together.abs().max()) if together.numel() else 0.0
    tolerance = (1e-2 if params[0].element_size() < 4 else 1e-4) * max(scale, 1.0)
    if float((together - alone).abs().max()) <= tolerance:
        return True
    warn(
        f"unsloth_tiled_mlp: {type(module).__name__} does not compute each row on its own (a probe of 3 rows "
        f"together differs from each row alone): it runs untiled"
    )
    return False


def untile_mlp(model: Any) -> None:
    """Undo :func:`tile_mlp`: each module's own forward again."""
    for module in tiled_modules(model):
        _untile(module)


def _untile(module: torch.nn.Module) -> None:
    if hasattr(module, ATTR):
        inner = vars(module).pop("slimrl_inner_forward", None)
        if inner is not None:
            module.forward = inner
        else:
            vars(module).pop("forward", None)  # the class's forward shows through again
        delattr(module, ATTR)


def is_tiled(model: Any) -> bool:
    return any(hasattr(m, ATTR) for m in tiled_modules(model))


def _own(module: torch.nn.Module) -> Any:
    """The module's untiled forward (bound to this module: a copy's is the copy's)."""
    inner = vars(module).get("slimrl_inner_forward")
    return inner if inner is not None else types.MethodType(type(module).forward, module)


def tiled_forward(self: torch.nn.Module, x: Any = None, *args: Any, **kwargs: Any) -> Any:
    """``self``'s forward a tile of rows at a time (module docstring)."""
    own = _own(self)
    rows = getattr(self, ATTR, None)
    if rows is None or args or kwargs or not isinstance(x, torch.Tensor) or x.dim() < 2:
        return own(x, *args, **kwargs)
    flat = x.reshape(-1, x.shape[-1])  # [N, H], N = batch x tokens
    if flat.shape[0] <= rows:
        return own(x)
    tiles = flat.split(rows)
    grad = torch.is_grad_enabled()
    first = checkpoint(own, tiles[0], use_reentrant=False) if grad else own(tiles[0])  # [n, H]
    if not isinstance(first, torch.Tensor) or first.dim() != 2 or first.shape[0] != tiles[0].shape[0]:
        _untile(self)
        what = f"shape {tuple(first.shape)}" if isinstance(first, torch.Tensor) else type(first).__name__
        warn(
            f"unsloth_tiled_mlp: {type(self).__name__} returns {what} for a tile of {tiles[0].shape[0]} rows, not "
            f"one row per row (not position-wise): it runs untiled"
        )
        return own(x)
    outs = [first] + [checkpoint(own, tile, use_reentrant=False) if grad else own(tile) for tile in tiles[1:]]
    out = torch.cat(outs)  # [N, H]
    return out.reshape(*x.shape[:-1], out.shape[-1])  # [B, T, H]
