"""TRL's own processor loading on a machine without torchvision: TRL's vision scripts and trainers call
``AutoProcessor.from_pretrained``, which for Qwen2-VL/Qwen2.5-VL stops at the video processor torchvision is needed
for. While slimrl is patched, that call falls back to the processor without its video part
(:func:`slimrl.models.vision.image_only_processor`: image prompts work; one line says what was left out), as
``FastVisionModel`` does; any other failure is TRL's and transformers' own."""

from __future__ import annotations

from typing import Any

from slimrl.patching.machinery.registry import Patch

TARGET = "transformers:AutoProcessor"


def from_pretrained_factory(orig: Any) -> Any:
    """``AutoProcessor.from_pretrained`` (a classmethod) with the image-only fallback."""

    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        from slimrl.models.vision import image_only_processor, needs_video_support

        try:
            return orig(pretrained_model_name_or_path, *args, **kwargs)
        except (ImportError, AttributeError, ValueError, OSError) as exc:
            if not needs_video_support(exc):
                raise
            return image_only_processor(
                str(pretrained_model_name_or_path), bool(kwargs.get("trust_remote_code", False)), exc
            )

    from_pretrained.__name__ = from_pretrained.__qualname__ = "slimrl_processor_from_pretrained"
    return classmethod(from_pretrained)


def processor_patch(algorithms: tuple[str, ...]) -> Patch:
    return Patch(algorithms, TARGET, "from_pretrained", from_pretrained_factory, wrap=True)
