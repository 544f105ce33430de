"""A LoRA adapter merged into its base model's weights, in fp32, as a plain (unquantized) state dict.

For every layer the adapter wraps: ``W = W_base + sum_a scaling_a * B_a @ A_a`` (Hu et al. 2021, LoRA,
https://arxiv.org/abs/2106.09685; ``scaling = alpha / r``, ``alpha / sqrt(r)`` with rsLoRA), with ``W_base``
dequantized first when the base is bitsandbytes 4- or 8-bit (PEFT's ``dequantize_bnb_weight``) and ``A``, ``B`` and
the sum taken in fp32, then cast once to the output dtype. PEFT's own ``merge_and_unload`` would add the delta in the
adapter's dtype (bf16 for a QLoRA adapter TRL trained) and, on a 4-bit base, quantize the sum back to 4 bits: the
rounding the merged model would then carry on every weight. Adapter variants PEFT merges differently (DoRA) go
through PEFT's own variant merge, on the fp32 dequantized weight. Layers the adapter does not wrap are copied
(dequantized if quantized). Nothing in the model is changed.

The merged tensors go to host memory one layer at a time, as each is computed (:func:`_to_host`): on a GPU only one
layer's fp32 merge is ever there beside the model, the engine and the optimizer state (a 7-8B model merged whole on
the device would need another 15 GiB of it).
"""

from __future__ import annotations

from typing import Any

import torch


def _quantized_weight(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return weight is not None and (
        getattr(weight, "quant_state", None) is not None or type(weight).__name__ in ("Params4bit", "Int8Params")
    )


def _dequantized(module: torch.nn.Module) -> torch.Tensor:
    """A linear layer's weight ``[out, in]`` in fp32 (bitsandbytes 4/8-bit dequantized by PEFT's helper)."""
    weight = module.weight
    if _quantized_weight(module):
        from peft.utils.integrations import dequantize_bnb_weight

        return dequantize_bnb_weight(
            weight, state=getattr(weight, "quant_state", None) or getattr(module, "state", None)
        ).float()
    return weight.detach().float()


def _lora_delta(layer: Any, adapter: str) -> torch.Tensor:
    """``scaling * B @ A`` of one adapter on one PEFT LoRA linear layer, in fp32 (``[out, in]``)."""
    a = layer.lora_A[adapter].weight.detach().float()  # [r, in]
    b = layer.lora_B[adapter].weight.detach().float()  # [out, r]
    delta = b @ a  # [out, in]
    if getattr(layer, "fan_in_fan_out", False):
        delta = delta.T
    return delta * float(layer.scaling[adapter])


def _merged_weight(layer: Any, adapters: list[str]) -> torch.Tensor:
    """The base weight of a PEFT LoRA layer plus its active adapters, fp32."""
    base = layer.get_base_layer()
    weight = _dequantized(base)  # [out, in]
    for adapter in adapters:
        if adapter not in getattr(layer, "lora_A", {}):
            continue
        variants = getattr(layer, "lora_variant", {}) or {}
        if adapter in variants:  # DoRA and the like: PEFT's own merge rule, on the fp32 weight
            weight = variants[adapter].merge_safe(layer, adapter, weight)
        elif isinstance(base, torch.nn.Linear) or hasattr(layer, "fan_in_fan_out"):
            weight = weight + _lora_delta(layer, adapter)
        else:
            weight = weight + layer.get_delta_weight(adapter).float()
    return weight


def _active_adapters(model: torch.nn.Module) -> list[str]:
    """The active adapter names: a property on PEFT models, a method on transformers models (none loaded: [])."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return list(model.active_adapters or [])
    if not getattr(model, "_hf_peft_config_loaded", False):
        return []
    return list(model.active_adapters() or [])


def merged_state_dict(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The base architecture's state dict with the active adapters merged (module docstring); ``dtype``: the
    floating dtype to write (default :func:`output_dtype`). ``model``: a PEFT model, or a plain (maybe quantized)
    model."""
    from peft.tuners.lora import LoraLayer

    dtype = dtype or output_dtype(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    adapters = _active_adapters(model)
    out: dict[str, torch.Tensor] = {}

    def put(name: str, tensor: torch.Tensor | None) -> None:
        if tensor is not None:
            out[name] = _to_host(tensor.detach().to(dtype) if tensor.is_floating_point() else tensor.detach())

    for name, module in base.named_modules():
        parts = name.split(".")
        if any(p.startswith("lora_") or p == "base_layer" for p in parts):
            continue  # inside a LoRA layer: handled with the layer
        prefix = f"{name}." if name else ""
        if isinstance(module, LoraLayer):
            put(prefix + "weight", _merged_weight(module, adapters))
            put(prefix + "bias", getattr(module.get_base_layer(), "bias", None))
            continue
        if _quantized_weight(module):
            put(prefix + "weight", _dequantized(module))
            put(prefix + "bias", getattr(module, "bias", None))
            continue
        for pname, param in module.named_parameters(recurse=False):
            put(prefix + pname, param)
        for bname, buf in module.named_buffers(recurse=False):
            if bname not in getattr(module, "_non_persistent_buffers_set", set()):
                put(prefix + bname, buf)
    return out


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` in host memory (a copy of a device tensor; a host tensor as it is)."""
    return t if t.device.type == "cpu" else t.to("cpu")


def output_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype a merged model is written in: the model's own floating dtype, read from its input embeddings
    (never quantized): bf16 / fp16 stay 16-bit, an fp32 model stays fp32, a 4-bit model gets the dtype it was
    loaded with."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    embeddings = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    if weight is not None and weight.is_floating_point():
        return weight.dtype
    return next((p.dtype for p in base.parameters() if p.is_floating_point()), torch.float32)


def plain_config(model: torch.nn.Module) -> Any:
    """A copy of the model's config without the quantization settings (the merged weights are plain)."""
    import copy

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = copy.deepcopy(base.config)
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    return config


def _no_init():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older transformers
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def merged_model(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A new plain model of the base architecture holding the merged weights (the input model is untouched)."""
    from transformers import AutoModelForCausalLM

    dtype = dtype or output_dtype(model)
    config = plain_config(model)
    config.dtype = dtype
    state = merged_state_dict(model, dtype)
    with _no_init():  # the weights come next: no random initialisation to throw away
        merged = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = merged.load_state_dict(state, strict=False, assign=True)
    tied = {k for k in missing if "lm_head" in k and getattr(config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"the merged weights do not match the {type(merged).__name__} architecture (missing "
            f"{sorted(set(missing) - tied)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    if tied:
        merged.tie_weights()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base, "generation_config", None) is not None:
        merged.generation_config = base.generation_config
    return merged.eval()
