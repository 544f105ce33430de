"""Model loading, LoRA and mode switching."""

from slimrl.models.fast_language_model import FastLanguageModel, FastModel, FastVisionModel

__all__ = ["FastLanguageModel", "FastModel", "FastVisionModel"]
