"""What moves between the training model and the engine: the LoRA adapter as tensors, and shared base weights.

* :func:`adapter_tensors` reads the live adapter (PEFT's own ``get_peft_model_state_dict``: the saved-file names,
  no adapter name) as detached copies in the engine's dtype; vLLM scales ``lora_b`` in place when it loads an
  adapter, so the training parameters must not be handed over by reference.
* :func:`share_base_weights` points each frozen base parameter of the training model at the engine's tensor with
  the same values (packed ``qkv_proj`` / ``gate_up_proj`` rows are sliced as views), so the base weights exist
  once. A parameter is shared only when shape, dtype, device and every value match; on vLLM's CPU back end the
  linear layers are repacked for oneDNN (their weight is an empty tensor), so only embeddings, norms and the tied
  head can be shared there.
"""

from __future__ import annotations

from typing import Any

import torch

_PEFT_PREFIX = "base_model.model."


def _normalize(name: str) -> str:
    if name.startswith(_PEFT_PREFIX):
        name = name[len(_PEFT_PREFIX) :]
    return name.replace(".base_layer.", ".")


def adapter_tensors(peft_model: Any, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict]:
    """(``{PEFT file name: copy}``, adapter config dict) of the active LoRA adapter of ``peft_model``."""
    from peft import get_peft_model_state_dict

    name = peft_model.active_adapter
    name = name[0] if isinstance(name, list | tuple) else name
    state = get_peft_model_state_dict(peft_model, adapter_name=name)
    tensors = {k: v.detach().to(dtype=dtype, copy=True) for k, v in state.items()}
    config = peft_model.peft_config[name].to_dict()
    config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}
    return tensors, config


def share_base_weights(hf_model: torch.nn.Module, engine_model: torch.nn.Module) -> int:
    """Make frozen base parameters of ``hf_model`` views of ``engine_model``'s equal tensors; returns bytes freed."""
    engine = {_normalize(n): p for n, p in engine_model.named_parameters()}
    packed = getattr(engine_model, "packed_modules_mapping", {}) or {}
    member_of = {m: (group, i) for group, members in packed.items() for i, m in enumerate(members)}
    hf = dict(hf_model.named_parameters())
    hf_norm = {_normalize(n): p for n, p in hf.items()}
    shared = 0
    for name, param in hf_norm.items():
        if param.requires_grad:
            continue
        view = _engine_view(name, hf_norm, engine, packed, member_of)
        if view is None or view.shape != param.shape or view.dtype != param.dtype or view.device != param.device:
            continue
        if view.data_ptr() == param.data_ptr() or not torch.equal(view, param.data):
            continue
        param.data = view
        shared += param.numel() * param.element_size()
    return shared


def _engine_view(name: str, hf: dict, engine: dict, packed: dict, member_of: dict) -> torch.Tensor | None:
    """The engine tensor (or row slice of a packed one) holding HF parameter ``name``."""
    if name in engine:
        target = engine[name].data
        if target.dim() == 0 or target.numel() == 0:
            return None
        rows = hf[name].shape[0]
        return target[:rows] if target.shape[0] > rows else target  # vocab padded to a multiple
    module, leaf = name.rsplit(".", 1)
    parent, _, proj = module.rpartition(".")
    if proj not in member_of:
        return None
    group, index = member_of[proj]
    target = engine.get(f"{parent}.{group}.{leaf}")
    if target is None or target.numel() == 0:
        return None
    start = 0
    for sibling in packed[group][:index]:
        sib = hf.get(f"{parent}.{sibling}.{leaf}")
        if sib is None:
            return None
        start += sib.shape[0]
    rows = hf[name].shape[0]
    return target.data[start : start + rows] if start + rows <= target.shape[0] else None


def shared_storage_bytes(hf_model: torch.nn.Module, engine_model: torch.nn.Module) -> int:
    """Bytes of ``hf_model``'s frozen parameters whose memory the engine's model uses too (the same storage)."""
    engine = {
        t.untyped_storage().data_ptr()
        for t in (*engine_model.parameters(), *engine_model.buffers())
        if t.device.type != "meta" and t.numel()
    }
    seen: set[int] = set()
    total = 0
    for p in hf_model.parameters():
        if p.requires_grad or id(p) in seen or not p.numel():
            continue
        seen.add(id(p))
        if p.untyped_storage().data_ptr() in engine:
            total += p.numel() * p.element_size()
    return total
