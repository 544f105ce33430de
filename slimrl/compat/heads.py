"""How a causal LM turns its last hidden state into logits: the head module and its logit transform."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def logit_transform(config) -> tuple[float, float | None]:
    """``(scale, softcap)`` the model applies to ``lm_head`` outputs, read from its (text) config.

    Same reading as TRL's ``add_fused_lm_head``: ``logit_scale`` / ``output_multiplier`` / ``lm_head_multiplier``
    multiply, Granite/MiniCPM3 ``logits_scaling`` divides (HyperCLOVA X multiplies), then Gemma-style
    ``final_logit_softcapping`` caps: ``c * tanh(scale * x / c)``.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    softcap = getattr(text, "final_logit_softcapping", None)
    scale = getattr(text, "logit_scale", None)
    if scale is None:
        scale = getattr(text, "output_multiplier", None)
    if scale is None:
        scale = getattr(text, "lm_head_multiplier", None)
    if scale is None and getattr(text, "logits_scaling", None) is not None:
        scale = text.logits_scaling if text.model_type == "hyperclovax" else 1 / text.logits_scaling
    return (1.0 if scale is None else float(scale)), (None if softcap is None else float(softcap))


def plain_linear_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output projection when it is a plain, fully materialised ``nn.Linear`` (else None).

    None for heads slimrl must not bypass: LoRA on the head (``base_layer``), quantized heads, and ZeRO-3
    partitioned weights (``ds_id``) that only exist inside the module's own forward. A frozen head that FSDP2 made
    its own unit (``fully_shard``: the class becomes ``FSDPLinear(FSDPModule, Linear)``, the weight a sharded
    ``DTensor``) is plain: its forward still runs (FSDP's hooks with it) and the weight is gathered with
    ``full_tensor()`` where it is read; a trainable one stays on TRL's path (FSDP2 reduces its gradient itself).
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear and not (_fsdp2_linear(head) and not head.weight.requires_grad):
        return None
    if hasattr(head.weight, "ds_id") or head.weight.numel() == 0:
        return None
    return head


def _fsdp2_linear(module: object) -> bool:
    """``module`` is a plain ``nn.Linear`` that FSDP2's ``fully_shard`` turned into its own unit."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(module, FSDPModule) and type(module).__mro__[1:3] == (FSDPModule, torch.nn.Linear)


@contextmanager
def capture_head_input(head: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """While active, ``head``'s input is recorded and the head itself projects zero positions.

    The model's forward still runs end to end (through DDP/accelerate wrappers, so gradient hooks fire), but the
    ``[B, T, V]`` logits are never built: the head receives ``hidden[..., :0, :]`` and returns an empty tensor.
    The recorded ``hidden [B, T, H]`` stays in the autograd graph of the backbone.
    """
    box: list[torch.Tensor] = []

    def hook(module, args):
        hidden = args[0]  # [B, T, H]
        box.append(hidden)
        return (hidden[..., :0, :],) + tuple(args[1:])

    handle = head.register_forward_pre_hook(hook)
    try:
        yield box
    finally:
        handle.remove()
