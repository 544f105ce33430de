"""Where LoRA goes by default (every attention and MLP projection the model has) and the dtype a model loads in when
none is asked for."""

from __future__ import annotations

import torch

from slimrl.compat.devices import is_bfloat16_supported
from slimrl.models.vision import ATTENTION_PARTS, on_path

# Projection names of the attention and MLP blocks across common architectures (Llama, Qwen, Mistral, Gemma,
# Phi-3 fused qkv/gate_up, GPT-2/NeoX style). Only those present in the model are targeted.
_PROJECTION_NAMES = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "qkv_proj",
    "gate_up_proj",
    "c_attn",
    "c_proj",
    "c_fc",
    "query_key_value",
    "dense",
    "dense_h_to_4h",
    "dense_4h_to_h",
    "fc1",
    "fc2",
    "out_proj",
    "w1",
    "w2",
    "w3",
    "wq",
    "wk",
    "wv",
    "wo",
)


def _default_dtype() -> torch.dtype:
    if is_bfloat16_supported():
        return torch.bfloat16
    if torch.cuda.is_available():
        return torch.float16
    return torch.float32


def default_target_modules(model: torch.nn.Module, attention: bool = True, mlp: bool = True) -> list[str]:
    """Every attention and MLP projection name present in ``model`` (the LM head and embeddings excluded); with
    ``attention`` or ``mlp`` False, the full paths of the other kind only (a projection is attention's when a module
    on its path is named ``*attn*`` / ``*attention*``)."""
    found = {
        name: name.rsplit(".", 1)[-1]
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in _PROJECTION_NAMES
    }
    if not found:
        raise ValueError("could not find attention/MLP projections in the model; pass target_modules=[...]")
    if attention and mlp:
        return [n for n in _PROJECTION_NAMES if n in set(found.values())]

    targets = [path for path in found if on_path(path, ATTENTION_PARTS) == attention]
    if not targets:
        raise ValueError(
            f"finetune_attention_modules={attention}, finetune_mlp_modules={mlp}: no projection "
            f"left to put an adapter on; set one of them to True"
        )
    return targets
