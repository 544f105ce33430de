"""Peak live tensor bytes of slimrl's own code paths, measured by running them on the meta device.

A meta tensor has a shape, a dtype and a storage size but no data, so the real model (built from its config on
``torch.device("meta")``, LoRA adapter and checkpointing included) runs its real forward and backward at the real
batch shape in well under a second and allocates nothing. :class:`LiveBytes` (a ``TorchDispatchMode``) adds the
storage bytes of every tensor an op creates and subtracts them when that storage dies; its peak is the peak of live
activations, saved tensors, gradients and temporaries of the pass, exactly as the code path creates them (what
checkpointing keeps, what the chunked head allocates per block). Weights and optimizer state exist before the pass
and are counted separately (:mod:`slimrl.planning.plan`).

Two things are not op outputs and so are not seen: the allocator's slack (caching on CUDA, fragmentation on CPU:
the verdict's band, :mod:`slimrl.planning.verdict`) and kernels' internal workspaces (small).

transformers checks some masks with ``.all()``/``.item()``, which a meta tensor cannot answer; during the trace its
``masking_utils.is_tracing`` answers yes, so it takes the branch it takes under ``torch.compile`` (the plain causal
mask), the one a batch without padding takes anyway.

Attention: on the meta device ``scaled_dot_product_attention`` decomposes into its math form, which materialises the
``[B, heads, T, T]`` scores; the kernels a real run uses (flash / memory-efficient, on CPU and CUDA) keep only the
inputs, the output and a ``[B, heads, T]`` fp32 log-sum-exp. During the trace :class:`_FlashLikeAttention` stands in
for it with exactly those tensors (without it the plan would count the math form's scores, which no real run
holds). A CUDA plan (:func:`cuda_attention`) adds what CUDA's SDPA keeps where transformers passes a mask (Gemma 3's
sliding-window layers): the boolean mask converted to a bias of the query's dtype, kept for the backward.
"""

from __future__ import annotations

import weakref
from contextlib import ExitStack
from typing import Any
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LiveBytes(TorchDispatchMode):
    """Live and peak bytes of the storages ops create while the mode is on; the storages of ``existing`` tensors
    (weights, buffers: counted elsewhere) are not counted when an op returns a view of them (``W.t()``)."""

    def __init__(self, existing: Any = ()) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._seen: weakref.WeakSet = weakref.WeakSet(t.untyped_storage() for t in existing)

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                if storage not in self._seen:
                    self._seen.add(storage)
                    nbytes = storage.nbytes()
                    self.live += nbytes
                    weakref.finalize(storage, self._free, nbytes)
        self.peak = max(self.peak, self.live)
        return out


def meta_model(
    config: Any, dtype: torch.dtype, lora_r: int, checkpoint_every: int = 0, tiled: bool = False, fused: bool = False
) -> Any:
    """The model on the meta device with a LoRA adapter of rank ``lora_r`` (0: none), checkpointing of every
    ``checkpoint_every``-th decoder layer (0: off), with ``tiled`` its MLPs tiled as ``unsloth_tiled_mlp=True``
    tiles them (:mod:`slimrl.models.tiled_mlp`) and with ``fused`` its LoRA layers fused as ``get_peft_model``
    fuses them (:mod:`slimrl.models.fused_lora`: the adapters in the activations' dtype, no input copies)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if lora_r:  # on the projections FastLanguageModel.get_peft_model targets by default
        from peft import LoraConfig, get_peft_model

        from slimrl.models.fast_language_model import default_target_modules

        model = get_peft_model(
            model, LoraConfig(r=lora_r, lora_alpha=lora_r, target_modules=default_target_modules(model))
        )
        if fused:  # under autocast the fused ops compute the adapters in 16 bits: no input copies to emulate
            from slimrl.models.fused_lora import fuse_lora

            fuse_lora(model)
        if dtype.itemsize == 2:
            _lora_under_autocast(model, dtype, copies=not fused)
    if checkpoint_every:
        from slimrl.models.checkpointing import turn_on

        turn_on(_base(model), checkpoint_every)
    if tiled:
        from slimrl.models.tiled_mlp import tile_mlp

        tile_mlp(model)
    model.train()
    return model


def _lora_under_autocast(model: Any, dtype: torch.dtype, copies: bool = True) -> None:
    """A 16-bit run's LoRA layers as autocast runs them (accelerate's mixed precision wraps the forward; slimrl's
    routes call the backbone inside ``accelerator.autocast()``): PEFT casts each adapted input to the fp32 adapter's
    dtype (a copy, freed at once), autocast casts it back for the matmul and ``lora_A`` saves that 16-bit copy
    (2 bytes per element, not the 4 of an fp32 copy), and the adapter's products are 16-bit. Emulated on the meta
    device, where autocast does not run: 16-bit adapter weights, and an input cast that makes the fp32 copy and then
    the saved 16-bit one (``copies``; False: the adapter weights only, for the fused ops)."""
    import types

    def cast(self: Any, x: Any, _dtype: torch.dtype) -> Any:
        return None if x is None else x.to(torch.float32).to(dtype)

    for module in model.modules():
        if hasattr(module, "lora_A") and hasattr(module, "_cast_input_dtype"):
            if copies:
                module._cast_input_dtype = types.MethodType(cast, module)
            for p in (*module.lora_A.parameters(), *module.lora_B.parameters()):
                p.data = p.data.to(dtype)


class _FlashLikeAttention(torch.autograd.Function):
    """The memory of a fused attention kernel on the meta device: output like ``q``, a ``[B, heads, T]`` fp32
    log-sum-exp, saved inputs; the backward returns gradients shaped like the inputs."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)  # [B, H, T, Dv]
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)  # [B, H, T]
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    return _FlashLikeAttention.apply(query, key, value)


def _base(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _state(model: Any) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers()]


def _tracing() -> ExitStack:
    import transformers.masking_utils as masking

    stack = ExitStack()
    stack.enter_context(mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", _attention))
    if hasattr(masking, "is_tracing"):
        stack.enter_context(mock.patch.object(masking, "is_tracing", lambda *a, **k: True))
    return stack


class _CudaSdpa(torch.autograd.Function):
    """CUDA SDPA's memory (module docstring): the output and an fp32 log-sum-exp; a boolean mask becomes an additive
    bias of the query's dtype that the memory-efficient kernel keeps for its backward."""

    @staticmethod
    def forward(ctx, q, k, v, mask):
        out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)  # [B, H, T, D]
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)  # [B, H, T]
        bias = None
        if mask is not None:  # PyTorch's conversion: zeros of the query's dtype, filled where not logical_not(mask)
            negated = torch.empty(mask.shape, dtype=torch.bool, device=q.device)  # [B, 1, T, T]
            bias = torch.empty(mask.shape, dtype=q.dtype, device=q.device)  # [B, 1, T, T]
            del negated
        ctx.save_for_backward(q, k, v, out, lse, *(() if bias is None else (bias,)))
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors[:3]
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


def _sdpa(query, key, value, attn_mask=None, *args, **kwargs):
    return _CudaSdpa.apply(query, key, value, attn_mask)  # grouped-query heads stay unrepeated (enable_gqa)


def cuda_attention(model: Any, device: str) -> ExitStack:
    """Attention as on ``device`` (:func:`_sdpa`; on CPU no bias is kept); the causal mask of full-attention layers
    left to the kernel (a batch without padding: transformers passes none), a sliding-window mask built as
    transformers builds it."""
    import sys

    import transformers.masking_utils as masking

    stack = ExitStack()
    sdpa = _sdpa if device == "cuda" else lambda q, k, v, *a, **kw: _CudaSdpa.apply(q, k, v, None)
    stack.enter_context(mock.patch.object(torch.nn.functional, "scaled_dot_product_attention", sdpa))
    stack.enter_context(mock.patch.object(masking, "is_tracing", lambda *a, **k: True))
    module = sys.modules[type(_base(model)).__module__]
    if hasattr(module, "create_causal_mask"):
        stack.enter_context(mock.patch.object(module, "create_causal_mask", lambda *a, **k: None))
    return stack


def trace_logprob_pass(
    model: Any,
    rows: int,
    prompt: int,
    completion: int,
    *,
    grad: bool,
    entropy: bool,
    chunk_rows: int,
    device: str = "cpu",
) -> tuple[int, int]:
    """One log-prob pass as slimrl runs it (backbone, completion positions through the chunked head, and with
    ``grad`` the backward of their sum): (bytes live after the forward, peak bytes)."""
    from slimrl.ops import chunked_logprobs

    backbone, head = _base(model).get_decoder(), _base(model).get_output_embeddings()
    ids = torch.zeros(rows, prompt + completion, dtype=torch.long, device="meta")  # [B, T]
    attention = cuda_attention(model, "cuda") if device == "cuda" else _tracing()
    with attention, torch.set_grad_enabled(grad), LiveBytes(_state(model)) as live:
        hidden = backbone(input_ids=ids, use_cache=False).last_hidden_state  # [B, T, H]
        kept = hidden[:, -completion - 1 : -1].reshape(-1, hidden.size(-1))  # [B*L, H]
        targets = torch.zeros(kept.size(0), dtype=torch.long, device="meta")
        logps, ent = chunked_logprobs(
            kept, head.weight, targets, getattr(head, "bias", None), 1.0, chunk_rows=chunk_rows, with_entropy=entropy
        )
        del hidden, kept
        after_forward = live.live
        if grad:
            loss = logps.sum() + (ent.sum() * 0 if ent is not None else 0)
            del logps, ent
            loss.backward()
    return after_forward, live.peak


def trace_prefill(model: Any, rows: int, prompt: int) -> int:
    """Peak bytes of generation's prefill (no grad, KV cache kept) of ``rows`` prompts of ``prompt`` tokens."""
    base = _base(model)
    ids = torch.zeros(rows, prompt, dtype=torch.long, device="meta")
    was = base.training
    base.eval()
    try:
        with _tracing(), torch.no_grad(), LiveBytes(_state(model)) as live:
            out = base(input_ids=ids, use_cache=True, logits_to_keep=1)
            del out
    finally:
        base.train(was)
    return live.peak
