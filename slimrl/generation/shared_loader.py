"""A vLLM model loader that builds the engine on the training model's own weights: one copy of the base on the device.

vLLM's default loader reads the checkpoint into freshly allocated parameters, so the device holds the weights twice
until slimrl points the training model at the engine's (and, with a 4-bit training model, the engine holds a 16-bit
copy for good, and samples from other numbers than the loss scores). This loader (``load_format="slimrl_shared"``,
registered with vLLM's ``register_model_loader``; the in-process engine only) instead

1. builds vLLM's model on the meta device (no weight allocated), as vLLM's own IPC loader does;
2. gives every vLLM parameter the training model's tensor by reference: a 1:1 name (after PEFT's prefixes) shares
   it as it is; a packed vLLM parameter (``qkv_proj``, ``gate_up_proj``: ``packed_modules_mapping``) is built once
   by concatenating its parts, and the training model's parts become views of it; a tensor in another dtype or on
   another device than the engine's is copied (not shared);
3. gives every layer whose parts are bitsandbytes 4-bit (QLoRA) a linear method that runs the training model's own
   ``Linear4bit`` modules (:class:`SharedModules`): the engine generates from exactly the NF4 weights, scales and
   kernel the loss scores, and holds no copy of them (vLLM itself has no bitsandbytes method);
4. rebuilds the buffers vLLM computes at construction (rotary tables, attention scales with vLLM's own functions;
   the Gemma family's embedding scale), then runs vLLM's ``process_weights_after_loading``.

:meth:`SharedWeightsLoader.get_external_weight_memory` reports the training model's bytes on the engine's device, so
vLLM's start-up check (``request_memory``: free memory >= ``gpu_memory_utilization x total`` less those bytes) counts
them as what they are, the engine's own weights, already resident. A model this loader cannot map (another layout,
a buffer it does not know, e.g. Phi-3's LongRoPE tables) is loaded by vLLM's default loader instead, with one line;
what the failed build registered outside the model (attention layer names, cached rotary embeddings on the meta
device) is dropped first, so the default loader builds from a clean slate.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from slimrl.generation.weights import _normalize

LOAD_FORMAT = "slimrl_shared"
_SOURCES: dict[str, torch.nn.Module] = {}  # source key -> the training model the next engine start reads
_SCALES = ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")
logger = logging.getLogger(__name__)


class MappingError(RuntimeError):
    """The training model's parameters do not map onto the vLLM model's."""


def source_args(training_model: torch.nn.Module) -> dict[str, Any]:
    """``LLM(...)`` keywords that build the engine on ``training_model``'s weights (registers the loader)."""
    register()
    key = str(id(training_model))
    _SOURCES[key] = training_model
    return {"load_format": LOAD_FORMAT, "model_loader_extra_config": {"source": key}}


def release(key: str) -> None:
    _SOURCES.pop(key, None)


def _owners(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Parameter, torch.nn.Module]]:
    """``{normalized name: (parameter, the module holding it)}`` of the training model's base weights."""
    owners = {}
    for module_name, module in model.named_modules():
        for leaf, param in module.named_parameters(recurse=False):
            name = _normalize(f"{module_name}.{leaf}" if module_name else leaf)
            if "lora_" not in name:
                owners[name] = (param, module)
    return owners


def saved_in_bitsandbytes(hf_config: Any) -> bool:
    """A checkpoint saved in bitsandbytes' format (``quantization_config.quant_method == "bitsandbytes"``, as
    ``unsloth/*-bnb-4bit`` checkpoints are): vLLM has no such method; the engine is told the checkpoint is
    unquantized and this loader serves the training model's 4-bit modules (step 3 of the module docstring)."""
    quant = getattr(hf_config, "quantization_config", None)
    method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
    return str(getattr(method, "value", method) or "").lower() == "bitsandbytes"


def is_4bit(param: torch.Tensor) -> bool:
    return type(param).__name__ == "Params4bit"


def external_bytes(model: torch.nn.Module, device: torch.device) -> int:
    """Bytes of the training model's base weights on ``device`` (4-bit: packed weights and their scales)."""
    total, seen = 0, set()
    for param, _ in _owners(model).values():
        if param.device.type != device.type or id(param) in seen:
            continue
        seen.add(id(param))
        total += param.numel() * param.element_size()
        state = getattr(param, "quant_state", None)
        for t in (getattr(state, "absmax", None), getattr(getattr(state, "state2", None), "absmax", None)):
            total += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
    return total


def register() -> None:
    """Register the loader with vLLM (once)."""
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER, register_model_loader

    if LOAD_FORMAT not in _LOAD_FORMAT_TO_MODEL_LOADER:
        register_model_loader(LOAD_FORMAT)(_loader_class())


def _loader_class() -> type:
    from vllm.model_executor.layers.linear import LinearMethodBase
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class SharedModules(LinearMethodBase):
        """A vLLM linear layer computed by the training model's modules (its parts, concatenated on the output)."""

        def __init__(self, modules: list[torch.nn.Module]) -> None:
            self.modules = modules

        def create_weights(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError("the layer's weights are the training model's")

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            pass

        def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
            """``x @ W.T + b`` with each bias added once: a training module that has its own bias (``Linear4bit``
            adds it in its forward) already holds vLLM's, which is the same tensor (the loader shares it), so
            vLLM's ``bias`` is added only for parts that have none."""
            outs = [m(x) for m in self.modules]  # each [tokens, out_part]
            out = torch.cat(outs, dim=-1) if len(outs) > 1 else outs[0]  # [tokens, out]
            if bias is None or all(getattr(m, "bias", None) is not None for m in self.modules):
                return out
            return out + bias  # (a bias of vLLM's maps onto every part or none: _parts)

    class SharedWeightsLoader(BaseModelLoader):
        """See the module docstring."""

        def _source(self) -> torch.nn.Module:
            key = (self.load_config.model_loader_extra_config or {}).get("source")
            if key not in _SOURCES:
                raise MappingError(f"no training model registered under {key!r}")
            return _SOURCES[key]

        def get_external_weight_memory(self, vllm_config: Any) -> int:
            device = torch.device(vllm_config.device_config.device)
            return external_bytes(self._source(), device) if device.type == "cuda" else 0

        def download_model(self, model_config: Any) -> None:
            pass

        def load_weights(self, model: torch.nn.Module, model_config: Any) -> None:
            raise NotImplementedError("slimrl's engine takes new weights as a LoRA adapter, not by reloading")

        def load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> torch.nn.Module:
            before = _registrations(vllm_config)
            try:
                return build(self._source(), vllm_config, model_config, prefix, SharedModules)
            except MappingError as err:
                from vllm.config.load import LoadConfig
                from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

                _forget_since(vllm_config, before)
                print(f"slimrl: the engine loads its own copy of the weights ({err})", flush=True)
                return DefaultModelLoader(LoadConfig(load_format="auto")).load_model(vllm_config, model_config, prefix)

    return SharedWeightsLoader


def _registrations(vllm_config: Any) -> tuple[set, set]:
    """What building a vLLM model registers outside it: its attention layers by name in the compilation config's
    forward context, its rotary embeddings in vLLM's process-wide cache (``get_rope``)."""
    from vllm.model_executor.layers import rotary_embedding

    return set(vllm_config.compilation_config.static_forward_context), set(rotary_embedding._ROPE_DICT)


def _forget_since(vllm_config: Any, before: tuple[set, set]) -> None:
    """Drop what a failed build registered (:func:`_registrations`), so the default loader's build starts clean: its
    layer names would be duplicates, and a cached rotary embedding built on the meta device has no values."""
    from vllm.model_executor.layers import rotary_embedding

    context = vllm_config.compilation_config.static_forward_context
    for name in set(context) - before[0]:
        del context[name]
    for key in set(rotary_embedding._ROPE_DICT) - before[1]:
        del rotary_embedding._ROPE_DICT[key]


def build(source: torch.nn.Module, vllm_config: Any, model_config: Any, prefix: str, method: type) -> torch.nn.Module:
    """The vLLM model of ``vllm_config`` on ``source``'s weights (the module docstring)."""
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    device = torch.device(vllm_config.device_config.device)
    with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
        model = initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
    owners = _owners(source)
    packed = getattr(model, "packed_modules_mapping", {}) or {}
    modules = dict(model.named_modules(remove_duplicate=False))
    for name, param in list(model.named_parameters()):
        module_name, leaf = name.rsplit(".", 1)
        parts = _parts(name, module_name, leaf, owners, packed)
        if is_4bit(parts[0][0]):
            modules[module_name].quant_method = method([owner for _, owner in parts])
            tensor = parts[0][0].data  # where the layer lives (vLLM's LoRA reads the device from its weight)
        else:
            tensor = _joined([p for p, _ in parts], model_config.dtype, device)
        _replace(modules, param, _like(param, tensor))
    _rebuild_buffers(model, device, model_config.hf_text_config.hidden_size)
    process_weights_after_loading(model, model_config, device)
    return model.eval()


def _parts(name: str, module_name: str, leaf: str, owners: dict, packed: dict) -> list[tuple]:
    """The training model's (parameter, owner) pairs that make vLLM's parameter ``name``, in order."""
    if name in owners:
        return [owners[name]]
    parent, _, proj = module_name.rpartition(".")
    members = packed.get(proj)
    if not members or any(f"{parent}.{m}.{leaf}" not in owners for m in members):
        raise MappingError(f"no training-model weight for vLLM's {name}")
    parts = [owners[f"{parent}.{m}.{leaf}"] for m in members]
    if len({is_4bit(p) for p, _ in parts}) > 1:
        raise MappingError(f"{name}: 4-bit and 16-bit parts in one packed layer")
    return parts


def _joined(params: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One tensor for vLLM's parameter: the part itself (shared), or the parts concatenated on the rows with the
    training model's parts re-pointed at views of it (shared too); a copy where dtype or device differ."""
    if any(p.dtype != dtype or p.device.type != device.type for p in params):
        return torch.cat([p.detach().to(device=device, dtype=dtype) for p in params])
    if len(params) == 1:
        return params[0].data
    joined = torch.cat([p.data for p in params])  # [sum rows, in]
    start = 0
    for p in params:
        p.data = joined[start : start + p.shape[0]]
        start += p.shape[0]
    return joined


def _like(old: torch.nn.Parameter, tensor: torch.Tensor) -> torch.nn.Parameter:
    """``tensor`` as a parameter of ``old``'s class (vLLM's ``BasevLLMParameter`` kinds carry their loading methods)
    with its attributes (``weight_loader``, ``input_dim``, ...), no gradient."""
    cls = type(old) if isinstance(old, torch.nn.Parameter) else torch.nn.Parameter
    new = torch.Tensor._make_subclass(cls, tensor.detach(), False)  # neither class's __init__: no re-allocation
    new.__dict__.update(old.__dict__)
    return new


def _replace(modules: dict, old: torch.nn.Parameter, new: torch.nn.Parameter) -> None:
    """Put ``new`` wherever ``old`` is registered (a tied head holds the embedding's parameter too)."""
    for module in modules.values():
        for leaf, value in list(module._parameters.items()):
            if value is old:
                module._parameters[leaf] = new


def _rebuild_buffers(model: torch.nn.Module, device: torch.device, hidden_size: int) -> None:
    """Buffers vLLM computed at construction, left on the meta device, rebuilt with vLLM's own functions."""
    from vllm.model_executor.layers.attention.attention import set_default_quant_scales

    for name, module in model.named_modules():
        for leaf, buf in list(module._buffers.items()):
            if buf is None or buf.device.type != "meta":
                continue
            if leaf == "cos_sin_cache" and hasattr(module, "_compute_cos_sin_cache"):
                module._buffers[leaf] = module._compute_cos_sin_cache().to(device, module.dtype)
            elif leaf == "normalizer" and buf.dim() == 0:  # the Gemma family's embedding scale, sqrt(hidden)
                module._buffers[leaf] = torch.tensor(hidden_size**0.5, dtype=buf.dtype, device=device)
            elif leaf in _SCALES:
                with device:
                    set_default_quant_scales(module, register_buffer=True)
            else:
                raise MappingError(f"vLLM's buffer {name}.{leaf} is not one the loader rebuilds")
    for name, param in model.named_parameters():
        if param.device.type == "meta":
            raise MappingError(f"vLLM's {name} has no weight")
