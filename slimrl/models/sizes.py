"""How many bytes a model's weights and a LoRA adapter take, from its config alone (the meta device: no weight is
read or allocated)."""

from __future__ import annotations

from typing import Any

import torch

from slimrl.compat.quant import NF4_BYTES


def _meta_model(config: Any, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _decoder_linear(name: str, module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear) and ".layers." in f".{name}."


def weight_bytes(config: Any, dtype: torch.dtype, load_in_4bit: bool = False) -> int:
    """The loaded weights' bytes: every parameter in ``dtype``, the decoder's linear layers in NF4 with
    ``load_in_4bit`` (bitsandbytes quantizes those; embeddings, head and norms stay 16-bit). A tied head counts
    once."""
    model = _meta_model(config, dtype)
    seen: set[int] = set()
    total = 0.0
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            quantized = load_in_4bit and _decoder_linear(name, module)
            total += param.numel() * (NF4_BYTES if quantized else param.element_size())
    return int(total)


def adapter_bytes(config: Any, rank: int) -> int:
    """An fp32 LoRA adapter of ``rank`` on every linear layer of the decoder: ``rank x (in + out) x 4`` each."""
    model = _meta_model(config, torch.bfloat16)
    return sum(rank * (m.in_features + m.out_features) * 4 for n, m in model.named_modules() if _decoder_linear(n, m))
