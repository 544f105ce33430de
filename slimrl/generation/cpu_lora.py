"""Single-adapter fast path for vLLM's PyTorch LoRA ops (its CPU back end).

vLLM's ``bgmv_shrink`` / ``bgmv_expand`` / ``bgmv_expand_slice`` (``vllm/lora/ops/torch_ops/lora_ops.py``, used by
``PunicaWrapperCPU`` and by the ``sgmv_*`` prefill ops) gather one copy of the LoRA matrix per token
(``weights[indices]``: ``[N, out, r]``) and contract with ``einsum``. slimrl's engine serves one adapter, so every
token carries the same index: the same product is one GEMM against that adapter's matrix, with no per-token copy.

    shrink:  y[:, :r]  = scale * x @ A_i^T          x [N, in],  A_i [r, in]
    expand:  y[:, o:o+s] (+)= x @ B_i^T             x [N, r],   B_i [s, out-slice]

Where the indices differ (several adapters, or -1 = no adapter for some tokens) the original op runs, so results
are vLLM's own in every case; only the summation order of the GEMM differs (tested against float64).
:func:`install` swaps the three names in both modules that hold them (reversibly, :func:`uninstall`).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

_MODULES = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.punica_wrapper.punica_cpu")
_NAMES = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_ORIGINALS: dict[tuple[str, str], Any] = {}


def _one_adapter(weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor | None:
    """The ``[out, in]`` matrix every token uses, or None when tokens use different (or no) adapters."""
    if indices.numel() == 0:
        return None
    first = int(indices[0])
    if first < 0 or not bool((indices == first).all()):
        return None
    w = weights[first]  # [1, out, in] or [out, in]
    return w.squeeze(0) if w.dim() == 3 else w


def fast_bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                     lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    w = _one_adapter(lora_a_weights, lora_indices_tensor)
    if w is None:
        return _ORIGINALS[(_MODULES[0], "bgmv_shrink")](inputs, lora_a_weights, output_tensor, lora_indices_tensor,
                                                        scaling)
    dtype = output_tensor.dtype
    out = inputs.to(dtype) @ w.to(dtype).T  # [N, r]
    output_tensor[:, : out.shape[1]] = scaling * out


def fast_bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                     lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    w = _one_adapter(lora_b_weights, lora_indices_tensor)
    if w is None:
        return _ORIGINALS[(_MODULES[0], "bgmv_expand")](inputs, lora_b_weights, output_tensor, lora_indices_tensor,
                                                        add_inputs)
    dtype = output_tensor.dtype
    out = inputs.to(dtype) @ w.to(dtype).T  # [N, out]
    limit = 1 if out.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]  # as vLLM's op
    common = min(out.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common] += out[:limit, :common]
    else:
        output_tensor[:, :common] = out[:limit, :common]


def fast_bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                           lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                           add_inputs: bool = True) -> None:
    w = _one_adapter(lora_b_weights, lora_indices_tensor)
    if w is None:
        return _ORIGINALS[(_MODULES[0], "bgmv_expand_slice")](inputs, lora_b_weights, output_tensor,
                                                              lora_indices_tensor, slice_offset, slice_size,
                                                              add_inputs)
    dtype = output_tensor.dtype
    out = inputs.to(dtype) @ w.to(dtype).T  # [N, slice_size]
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += out
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = out


_FAST = {"bgmv_shrink": fast_bgmv_shrink, "bgmv_expand": fast_bgmv_expand,
         "bgmv_expand_slice": fast_bgmv_expand_slice}


def install() -> bool:
    """Swap in the fast path (idempotent); False where this vLLM lacks the PyTorch LoRA ops."""
    if _ORIGINALS:
        return True
    try:
        modules = [importlib.import_module(m) for m in _MODULES]
    except ImportError:
        return False
    if not all(hasattr(m, n) for m in modules for n in _NAMES):
        return False
    for name, module in zip(_MODULES, modules):
        for attr in _NAMES:
            _ORIGINALS[(name, attr)] = getattr(module, attr)
            setattr(module, attr, _FAST[attr])
    return True


def uninstall() -> None:
    """Put vLLM's own ops back."""
    for (name, attr), fn in _ORIGINALS.items():
        setattr(importlib.import_module(name), attr, fn)
    _ORIGINALS.clear()
