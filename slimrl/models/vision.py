"""Vision-language models for ``FastModel`` / ``FastVisionModel``: telling one apart from a text model, loading it
with its processor, and choosing where LoRA goes (Unsloth's ``finetune_vision_layers`` /
``finetune_language_layers`` / ``finetune_attention_modules`` / ``finetune_mlp_modules``).

A model is vision-language when its config has a ``vision_config`` (Qwen2/2.5/3-VL, Gemma 3, Idefics3/SmolVLM,
LLaVA, Mistral 3, ...); it loads through ``AutoModelForImageTextToText`` and ``AutoProcessor``. transformers' video
processors need torchvision; where it is missing (CPU-only installs) a processor that also handles video (Qwen-VL)
cannot be built at all, so the processor is rebuilt from its image processor and tokenizer without the video slot,
with one line saying so: image prompts never reach the video processor.
"""

from __future__ import annotations

from typing import Any

import torch

from slimrl.compat.runtime.callsite import warn

VISION_PARTS = ("vision", "visual", "image", "patch")
ATTENTION_PARTS = ("attn", "attention")
MLP_PARTS = ("mlp", "feed_forward", "ffn")


def on_path(name: str, tags: tuple[str, ...]) -> bool:
    """Whether a module above the layer ``name`` (a dotted path) has one of ``tags`` in its name."""
    return any(tag in part for part in name.lower().split(".")[:-1] for tag in tags)


def is_vision_language(config: Any) -> bool:
    """Whether ``config`` describes a vision-language model (it has a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


def image_only(processor_cls: type) -> type:
    """``processor_cls`` whose constructor takes no video processor (module docstring); its ``video_processor`` is
    None."""

    def init(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        processor_cls.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    return type(processor_cls.__name__, (processor_cls,), {"__init__": init, "video_processor": None})


def load_processor(path: str, trust_remote_code: bool = False) -> Any:
    """``AutoProcessor`` of ``path``; without torchvision, a video-capable processor is rebuilt image-only."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (ImportError, AttributeError, ValueError, OSError) as exc:
        if not needs_video_support(exc):
            raise
        return image_only_processor(path, trust_remote_code, exc)


def needs_video_support(exc: BaseException) -> bool:
    """Whether a processor failed to load for its video part (torchvision missing)."""
    return "video" in f"{type(exc).__name__} {exc}".lower() or "torchvision" in str(exc).lower()


def image_only_processor(path: str, trust_remote_code: bool, reason: BaseException) -> Any:
    """The processor of ``path`` built without its video processor (``reason``: why the full one did not load);
    one warning says what was left out. ``reason`` is raised again when the processor class is unknown."""
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer
    from transformers.models.auto.processing_auto import processor_class_from_name

    config = transformers.AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    name = _processor_class_name(path) or f"{type(config).__name__.removesuffix('Config')}Processor"
    cls = processor_class_from_name(name)
    if cls is None:
        raise reason
    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    processor = image_only(cls)(
        image_processor=AutoImageProcessor.from_pretrained(path),
        tokenizer=tokenizer,
        chat_template=getattr(tokenizer, "chat_template", None),
    )
    warn(
        f"{name}: loaded without its video processor ({first_line(reason)}); image prompts work, "
        f"video prompts need torchvision"
    )
    return processor


def first_line(exc: BaseException) -> str:
    """The first non-blank line of ``exc``'s message (transformers' backend errors start with a newline), at most
    160 characters; the exception's type where the message is blank."""
    line = next((t.strip() for t in str(exc).splitlines() if t.strip()), "")
    return line[:160] or type(exc).__name__


def _processor_class_name(path: str) -> str | None:
    import json
    from pathlib import Path

    for file in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        f = Path(path) / file
        if f.is_file():
            name = json.loads(f.read_text()).get("processor_class")
            if name:
                return name
    return None


def vision_target_modules(
    model: torch.nn.Module, vision: bool, language: bool, attention: bool, mlp: bool
) -> list[str]:
    """Full paths of the ``nn.Linear`` layers LoRA goes on in a vision-language model: those of the vision tower
    (a path part naming ``vision`` / ``visual`` / ``image`` / ``patch``) when ``vision``, of the language model
    (the rest) when ``language``, inside an attention block (``attn`` / ``attention``) when ``attention``, inside an
    MLP (``mlp`` / ``feed_forward`` / ``ffn``) when ``mlp``. The LM head, embeddings and the projector between the
    two towers (no attention or MLP block on its path) get none, as with Unsloth's defaults."""
    if not (vision or language):
        raise ValueError(
            "finetune_vision_layers=False and finetune_language_layers=False: no layer left to put an "
            "adapter on; set one of them to True"
        )
    if not (attention or mlp):
        raise ValueError(
            "finetune_attention_modules=False and finetune_mlp_modules=False: no projection left to "
            "put an adapter on; set one of them to True"
        )
    out = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or "lm_head" in name:
            continue
        in_vision = on_path(name, VISION_PARTS)
        is_attention = on_path(name, ATTENTION_PARTS)
        is_mlp = not is_attention and on_path(name, MLP_PARTS)
        if (vision if in_vision else language) and ((attention and is_attention) or (mlp and is_mlp)):
            out.append(name)
    if not out:
        raise ValueError(
            "found no attention/MLP projection for the finetune_* choices given; pass target_modules=[...]"
        )
    return out
