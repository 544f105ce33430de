"""Single-adapter fast path for vLLM's PyTorch LoRA ops (its CPU back end).

vLLM's ``bgmv_shrink`` / ``bgmv_expand`` / ``bgmv_expand_slice`` (``vllm/lora/ops/torch_ops/lora_ops.py``, used by
``PunicaWrapperCPU`` and by the ``sgmv_*`` prefill ops) gather one copy of the LoRA matrix per token
(``weights[indices]``: ``[N, out, r]``) and contract with ``einsum``. slimrl's engine serves one adapter, so every
token carries the same index: the same product is one GEMM against that adapter's matrix, with no per-token copy.

    shrink:  y[:, :r]  = scale * x @ A_i^T          x [N, in],  A_i [r, in]
    expand:  y[:, o:o+s] (+)= x @ B_i^T             x [N, r],   B_i [s, out-slice]

Where the indices differ (several adapters, or -1 = no adapter for some tokens) the original op runs, so results
are vLLM's own in every case; only the summation order of the GEMM differs (tested against float64).
:func:`fast_add_lora_linear` runs a packed layer's slices (q/k/v, gate/up) as two GEMMs: the A matrices stacked,
the B matrices block-diagonal, both built once per adapter.
:func:`install` swaps the three names in both modules that hold them and the wrapper's ``add_lora_linear``
(reversibly, :func:`uninstall`; both through :mod:`slimrl.compat.runtime.swaps`).
"""

from __future__ import annotations

import importlib
import weakref
from typing import Any

import torch

from slimrl.compat.runtime.swaps import Swapped, restore, swap

_MODULES = ("vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.punica_wrapper.punica_cpu")
_NAMES = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_SWAPS: dict[tuple, Swapped] = {}  # (module, name) / _WRAPPER -> what install replaced


# [weak reference to the buffer of the last indices seen, (data_ptr, numel, version) of them, their uniform slot]
_UNIFORM: list = [None, None, None]


def _uniform_slot(indices: torch.Tensor) -> int | None:
    """The adapter slot every token uses, or None when tokens use different (or no) adapters.

    vLLM writes the step's indices once (``copy_`` into its buffer, which bumps the version counter) and every LoRA
    layer of the step reads them, so the answer is kept until the buffer changes. The buffer is held weakly and
    compared by identity, so a later engine's buffer at the same address and version is never answered from it."""
    if indices.is_inference():  # tensors made under inference_mode (prefill's exploded indices) track no version
        return _slot_of(indices)
    buffer = indices if indices._base is None else indices._base  # the token_lora_indices property: a view
    key = (indices.data_ptr(), indices.numel(), indices._version)
    if _UNIFORM[0] is not None and _UNIFORM[0]() is buffer and _UNIFORM[1] == key:
        return _UNIFORM[2]
    slot = _slot_of(indices)
    _UNIFORM[:] = [weakref.ref(buffer), key, slot]
    return slot


def _slot_of(indices: torch.Tensor) -> int | None:
    """:func:`_uniform_slot` computed from the indices themselves."""
    first = int(indices[0]) if indices.numel() else -1
    return first if first >= 0 and bool((indices == first).all()) else None


def _slot_matrix(stacked: torch.Tensor, i: int) -> torch.Tensor:
    """Adapter slot ``i`` of vLLM's stacked LoRA weights: ``[out, in]`` from ``[max_loras, 1, out, in]`` or
    ``[max_loras, out, in]``."""
    w = stacked[i]
    return w.squeeze(0) if w.dim() == 3 else w


def _one_adapter(weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor | None:
    """The ``[out, in]`` matrix every token uses, or None when tokens use different (or no) adapters."""
    first = _uniform_slot(indices)
    return None if first is None else _slot_matrix(weights, first)


def fast_bgmv_shrink(
    inputs: torch.Tensor,
    lora_a_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    w = _one_adapter(lora_a_weights, lora_indices_tensor)
    if w is None:
        return _SWAPS[(_MODULES[0], "bgmv_shrink")].seen(
            inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling
        )
    dtype = output_tensor.dtype
    out = inputs.to(dtype) @ w.to(dtype).T  # [N, r]
    output_tensor[:, : out.shape[1]] = scaling * out


def fast_bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    w = _one_adapter(lora_b_weights, lora_indices_tensor)
    if w is None:
        return _SWAPS[(_MODULES[0], "bgmv_expand")].seen(
            inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs
        )
    dtype = output_tensor.dtype
    out = inputs.to(dtype) @ w.to(dtype).T  # [N, out]
    limit = 1 if out.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]  # as vLLM's op
    common = min(out.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common] += out[:limit, :common]
    else:
        output_tensor[:, :common] = out[:limit, :common]


def fast_bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    w = _one_adapter(lora_b_weights, lora_indices_tensor)
    if w is None:
        return _SWAPS[(_MODULES[0], "bgmv_expand_slice")].seen(
            inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs
        )
    dtype = output_tensor.dtype
    out = inputs.to(dtype) @ w.to(dtype).T  # [N, slice_size]
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += out
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = out


_FAST = {"bgmv_shrink": fast_bgmv_shrink, "bgmv_expand": fast_bgmv_expand, "bgmv_expand_slice": fast_bgmv_expand_slice}
_WRAPPER = ("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU", "add_lora_linear")


def fast_add_lora_linear(
    self: Any,
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: tuple,
    lora_b_stacked: tuple,
    scale: float,
    output_slices: tuple,
    *,
    buffer: Any = None,
    **kwargs: Any,
) -> None:
    """``PunicaWrapperCPU.add_lora_linear`` for one adapter: two GEMMs whatever the number of slices.

        h  = x @ (scale * [A_1; ...; A_S]^T)        [N, S*r]  (float32, as vLLM's buffer)
        y[:, :sum n_s] += h @ blockdiag(B_1^T, ..., B_S^T)

    The packed ``scale * A^T`` and block-diagonal ``B^T`` are built once per adapter (:func:`_packed`): a decode step
    runs hundreds of these tiny products, so their per-op cost, not their FLOPs, is what counts (profile:
    docs/BENCHMARKS.md).
    """
    x2 = x.view(-1, x.shape[-1])  # [N, in]
    indices = self.token_lora_indices
    slot = _uniform_slot(indices) if indices.shape[0] == x2.shape[0] else None
    if slot is None or buffer is not None:
        return _SWAPS[_WRAPPER].seen(
            self, y, x, lora_a_stacked, lora_b_stacked, scale, output_slices, buffer=buffer, **kwargs
        )
    a_t, b_block = _packed(lora_a_stacked, lora_b_stacked, slot, scale, tuple(output_slices), y.dtype)
    h = x2.to(torch.float32) @ a_t  # [N, S*r]
    y2 = y.view(-1, y.shape[-1])
    y2[:, : b_block.shape[1]].addmm_(h.to(y.dtype), b_block)


_PACKS: dict[int, tuple] = {}  # id(layer's first A tensor) -> (weak reference to it, {key: packed})


def _packed(
    lora_a_stacked: tuple, lora_b_stacked: tuple, i: int, scale: float, output_slices: tuple, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(``scale * [A_1; ...; A_S]^T`` [in, S*r] float32, ``blockdiag(B_s^T)`` [S*r, sum n_s] ``dtype``) of adapter
    slot ``i``, rebuilt when vLLM writes a new adapter into the slot (the stacked tensors' version counters).

    Entries hang off the layer's own tensor (weakly), so an engine that is shut down takes its entries with it and
    a later engine allocated at the same addresses never sees them."""
    stacked = (*lora_a_stacked, *lora_b_stacked)
    if any(w.is_inference() for w in stacked):  # no version counter to tell a new adapter by: build, keep nothing
        return _pack(lora_a_stacked, lora_b_stacked, i, scale, output_slices, dtype)
    owner = _PACKS.get(id(stacked[0]))
    if owner is None or owner[0]() is not stacked[0]:
        ident = id(stacked[0])
        owner = (weakref.ref(stacked[0], lambda _: _PACKS.pop(ident, None)), {})
        _PACKS[ident] = owner
    per_layer = owner[1]
    key = (tuple(id(w) for w in stacked), i, scale, output_slices, dtype)
    versions = tuple(w._version for w in stacked)
    hit = per_layer.get(key)
    if hit is not None and hit[0] == versions:
        return hit[1], hit[2]
    a_t, b_block = _pack(lora_a_stacked, lora_b_stacked, i, scale, output_slices, dtype)
    per_layer[key] = (versions, a_t, b_block)
    return a_t, b_block


def _pack(
    lora_a_stacked: tuple, lora_b_stacked: tuple, i: int, scale: float, output_slices: tuple, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two matrices of :func:`_packed`, built from the stacked weights."""
    a = torch.cat([_slot_matrix(w, i) for w in lora_a_stacked])  # [S*r, in]
    a_t = (scale * a.to(torch.float32)).T.contiguous()  # [in, S*r]
    r = a.shape[0] // len(lora_a_stacked)
    b_block = torch.zeros(a.shape[0], sum(output_slices), dtype=dtype, device=a.device)  # [S*r, sum n_s]
    offset = 0
    for s, (w, size) in enumerate(zip(lora_b_stacked, output_slices)):
        b = _slot_matrix(w, i)  # [n_s, r]
        b_block[s * r : (s + 1) * r, offset : offset + size] = b[:size].to(dtype).T
        offset += size
    return a_t, b_block


def install() -> bool:
    """Swap in the fast path (idempotent); False where this vLLM lacks the PyTorch LoRA ops."""
    if _SWAPS:
        return True
    try:
        modules = [importlib.import_module(m) for m in _MODULES]
    except ImportError:
        return False
    if not all(hasattr(m, n) for m in modules for n in _NAMES):
        return False
    for name, module in zip(_MODULES, modules):
        for attr in _NAMES:
            _SWAPS[(name, attr)] = swap(module, attr, _FAST[attr])
    _SWAPS[_WRAPPER] = swap(getattr(modules[1], _WRAPPER[1]), _WRAPPER[2], fast_add_lora_linear)
    return True


def uninstall() -> None:
    """Put vLLM's own ops back."""
    for done in _SWAPS.values():
        restore(done)
    _SWAPS.clear()
