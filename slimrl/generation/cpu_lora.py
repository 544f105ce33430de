"""Single-adapter fast path for vLLM's PyTorch LoRA ops (its CPU back end).

vLLM's ``bgmv_shrink`` / ``bgmv_expand`` / ``bgmv_expand_slice`` (``vllm/lora/ops/torch_ops/lora_ops.py``, used by
``PunicaWrapperCPU`` and by the ``sgmv_*`` prefill ops) gather one copy of the LoRA matrix per token
(``weights[indices]``: ``[N, out, r]``) and contract with ``einsum``. slimrl's engine serves one adapter, so every
token carries the same index: the same product is one GEMM against that adapter's matrix, with no per-token copy.

    shrink:  y[:, :r]  = scale * x @ A_i^T          x [N, in],  A_i [r, in]
    expand:  y[:, o:o+s] (+)= x @ B_i^T             x [N, r],   B_i [s, out-slice]

Where the indices differ (several adapters, or -1 = no adapter for some tokens) the original op runs, so results
are vLLM's own in every case; only the summation order of the GEMM differs (tested against float64).
:func:`fast_add_lora_linear` also runs the A matrices of a packed layer's slices (q/k/v, gate/up) as one GEMM.
:func:`install` swaps the three names in both modules that hold them and the wrapper's ``add_lora_linear``
(reversibly, :func:`uninstall`).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

_MODULES = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.punica_wrapper.punica_cpu")
_NAMES = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_ORIGINALS: dict[tuple, Any] = {}


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
_WRAPPER = ("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU", "add_lora_linear")


def fast_add_lora_linear(self: Any, y: torch.Tensor, x: torch.Tensor, lora_a_stacked: tuple, lora_b_stacked: tuple,
                         scale: float, output_slices: tuple, *, buffer: Any = None, **kwargs: Any) -> None:
    """``PunicaWrapperCPU.add_lora_linear`` for one adapter: the slices' A matrices in one GEMM.

        h = scale * x @ [A_1; ...; A_S]^T           [N, S*r]  (float32, as vLLM's buffer)
        y[:, o_s:o_s+n_s] += h[:, s*r:(s+1)*r] @ B_s^T
    """
    x2 = x.view(-1, x.shape[-1])  # [N, in]
    indices = self.token_lora_indices
    w0 = _one_adapter(lora_a_stacked[0], indices) if indices.shape[0] == x2.shape[0] else None
    if w0 is None or buffer is not None:
        return _ORIGINALS[_WRAPPER](self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer,
                                    **kwargs)
    i = int(indices[0])
    a = torch.cat([w[i].squeeze(0) if w[i].dim() == 3 else w[i] for w in lora_a_stacked])  # [S*r, in]
    h = scale * (x2.to(torch.float32) @ a.to(torch.float32).T)  # [N, S*r]
    y2 = y.view(-1, y.shape[-1])
    r = h.shape[1] // len(lora_a_stacked)
    offset = 0
    for s, (w, size) in enumerate(zip(lora_b_stacked, output_slices)):
        b = w[i].squeeze(0) if w[i].dim() == 3 else w[i]  # [n_s, r]
        y2[:, offset: offset + size] += h[:, s * r:(s + 1) * r].to(y.dtype) @ b.to(y.dtype).T
        offset += size


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
    wrapper = getattr(modules[1], _WRAPPER[1])
    _ORIGINALS[_WRAPPER] = wrapper.__dict__[_WRAPPER[2]]
    setattr(wrapper, _WRAPPER[2], fast_add_lora_linear)
    return True


def uninstall() -> None:
    """Put vLLM's own ops back."""
    for key, fn in _ORIGINALS.items():
        if key == _WRAPPER:
            setattr(getattr(importlib.import_module(key[0]), key[1]), key[2], fn)
        else:
            setattr(importlib.import_module(key[0]), key[1], fn)
    _ORIGINALS.clear()
