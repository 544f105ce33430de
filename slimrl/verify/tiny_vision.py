"""Tiny random vision-language models and their processors, built from a config (nothing downloaded): the families
slimrl's vision tests, bench and example run on.

Each family keeps what makes TRL's image plumbing differ between them:

| family        | model class                          | vision inputs TRL passes                          |
|---------------|--------------------------------------|---------------------------------------------------|
| ``qwen2.5-vl``| ``Qwen2_5_VLForConditionalGeneration`` | ``pixel_values`` (patch rows), ``image_grid_thw`` |
| ``gemma3``    | ``Gemma3ForConditionalGeneration``   | ``pixel_values`` (one per image), ``token_type_ids`` |
| ``idefics3``  | ``Idefics3ForConditionalGeneration`` | ``pixel_values``, ``pixel_attention_mask``        |

The tokenizer is character-level (every printable ASCII character one token) with the family's image markers as
whole tokens and a small chat template of the family's shape that places the markers where an image part is. The
Qwen2.5-VL processor is built without its video processor: transformers' video processors need torchvision, which
has no CPU build beside the CPU torch used here; image prompts never reach it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from slimrl.models.vision import image_only
from slimrl.verify.tiny import chatml_char_tokenizer

FAMILIES = ("qwen2.5-vl", "gemma3", "idefics3")
WIDTH = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)

_MARKERS = {
    "qwen2.5-vl": ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"],
    "gemma3": ["<start_of_image>", "<end_of_image>", "<image_soft_token>"],
    "idefics3": ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"],
}
_IMAGE_PART = {
    "qwen2.5-vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "gemma3": "<start_of_image>",
    "idefics3": "<image>",
}


def chat_template(family: str) -> str:
    """A ChatML-shaped template (``<|im_start|>role\\n...<|im_end|>``) with ``family``'s image marker for each image
    part of a message."""
    return (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
        "{% if p['type'] == 'image' %}" + _IMAGE_PART[family] + "{% elif p['type'] == 'text' %}{{ p['text'] }}"
        "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )


def _tokenizer(family: str, vocab_size: int | None = None):
    extra = {}
    if family == "gemma3":
        extra = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
    tok = chatml_char_tokenizer(
        ["<pad>", "<|im_end|>", "<unk>", "<|im_start|>", *_MARKERS[family]], vocab_size, **extra
    )
    tok.chat_template = chat_template(family)
    return tok


@dataclass
class TinyVision:
    """A tiny model of one family, its processor and the image side length its processor expects."""

    family: str
    model: Any
    processor: Any
    image_size: int


def build(
    family: str,
    seed: int = 0,
    image_size: int = 56,
    dtype: torch.dtype = torch.float32,
    vocab_size: int | None = None,
    text_width: dict | None = None,
    vision_width: dict | None = None,
    vision_layers: int = 1,
) -> TinyVision:
    """A random ``family`` model (2 text layers of width 32, a 1-layer vision tower, unless ``text_width`` /
    ``vision_width`` / ``vision_layers`` say otherwise; ``vocab_size`` pads the vocabulary) and its processor;
    images are ``image_size`` pixels square (a multiple of 28)."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}; got {family!r}")
    tok = _tokenizer(family, vocab_size)
    ids = {t: tok.convert_tokens_to_ids(t) for t in _MARKERS[family]}
    text = {
        **WIDTH,
        "vocab_size": len(tok),
        "max_position_embeddings": 4096,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": None,
        "tie_word_embeddings": True,
        **(text_width or {}),
    }
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, **(vision_width or {})}
    torch.manual_seed(seed)
    if family == "qwen2.5-vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        half = text["hidden_size"] // text["num_attention_heads"] // 2  # rotary pairs per head
        temporal = half // 4  # Qwen2.5-VL's split of them (16, 24, 24 at head_dim 128)
        sections = [temporal, (half - temporal) // 2, half - temporal - (half - temporal) // 2]
        config = Qwen2_5_VLConfig(
            text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": sections}},
            vision_config=dict(
                depth=vision_layers,
                hidden_size=vision["hidden_size"],
                intermediate_size=vision["intermediate_size"],
                num_heads=vision["num_attention_heads"],
                out_hidden_size=text["hidden_size"],
                patch_size=14,
                spatial_merge_size=2,
                temporal_patch_size=2,
                fullatt_block_indexes=list(range(vision_layers)),
                window_size=112,
            ),
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
            tie_word_embeddings=True,
        )
        model = Qwen2_5_VLForConditionalGeneration(config)
        pixels = image_size * image_size
        images = Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels, patch_size=14, merge_size=2)
        processor = image_only(Qwen2_5_VLProcessor)(
            image_processor=images, tokenizer=tok, chat_template=tok.chat_template
        )
    elif family == "gemma3":
        from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
        from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

        tokens_per_image = 4
        config = Gemma3Config(
            text_config={
                **text,
                "head_dim": text["hidden_size"] // text["num_attention_heads"],
                "sliding_window": 64,
                "query_pre_attn_scalar": text["hidden_size"] // text["num_attention_heads"],
            },
            vision_config=dict(vision, num_hidden_layers=vision_layers, image_size=image_size, patch_size=14),
            mm_tokens_per_image=tokens_per_image,
            image_token_id=ids["<image_soft_token>"],
            boi_token_index=ids["<start_of_image>"],
            eoi_token_index=ids["<end_of_image>"],
            tie_word_embeddings=True,
        )
        model = Gemma3ForConditionalGeneration(config)
        images = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size})
        processor = Gemma3Processor(
            image_processor=images, tokenizer=tok, chat_template=tok.chat_template, image_seq_length=tokens_per_image
        )
    else:
        from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        scale = 2
        config = Idefics3Config(
            text_config={**text, "model_type": "llama"},
            vision_config=dict(vision, num_hidden_layers=vision_layers, image_size=image_size, patch_size=14),
            scale_factor=scale,
            image_token_id=ids["<image>"],
            tie_word_embeddings=True,
        )
        model = Idefics3ForConditionalGeneration(config)
        images = Idefics3ImageProcessorPil(
            do_image_splitting=False, size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size}
        )
        processor = Idefics3Processor(
            image_processor=images,
            tokenizer=tok,
            chat_template=tok.chat_template,
            image_seq_len=(image_size // 14) ** 2 // scale**2,
        )
    model = model.to(dtype)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 1
    return TinyVision(family, model, processor, image_size)


def images(n: int, size: int, seed: int = 0) -> list:
    """``n`` RGB images, ``size`` pixels square: a coloured background with 1-4 dots of another colour (a "how
    many dots" task; :func:`dot_count` gives the answer)."""
    from PIL import Image, ImageDraw

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        bg, fg = (tuple(int(v) for v in torch.randint(0, 256, (3,), generator=g)) for _ in range(2))
        img = Image.new("RGB", (size, size), bg)
        draw = ImageDraw.Draw(img)
        count = int(torch.randint(1, 5, (1,), generator=g))
        for _ in range(count):
            x, y = (int(v) for v in torch.randint(4, size - 8, (2,), generator=g))
            draw.ellipse((x, y, x + 5, y + 5), fill=fg)
        img.info["dots"] = count
        out.append(img)
    return out
