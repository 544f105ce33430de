"""Checks run before any compute when a patched trainer is built."""

from __future__ import annotations

from typing import Any


def model_max_seq_length(model: Any) -> int | None:
    """``max_seq_length`` recorded by ``FastLanguageModel.from_pretrained`` (None for other models)."""
    value = getattr(model, "max_seq_length", None)
    return value if isinstance(value, int) else None


def check_sequence_budget(model: Any, args: Any) -> None:
    """Prompt + completion lengths the config allows must fit the model's ``max_seq_length``.

    Uses ``max_completion_length`` and, where the TRL release has it, ``max_prompt_length``.
    """
    limit = model_max_seq_length(model)
    if limit is None or args is None:
        return
    completion = getattr(args, "max_completion_length", None) or 0
    prompt = getattr(args, "max_prompt_length", None) or 0
    if completion + prompt >= limit:
        parts = f"max_completion_length={completion}" + (f" + max_prompt_length={prompt}" if prompt else "")
        raise ValueError(
            f"{parts} leaves no room for the prompt within the model's max_seq_length={limit} "
            f"(FastLanguageModel.from_pretrained): lower max_completion_length or load the model with a larger "
            f"max_seq_length")


def check_batch_length(model: Any, n_tokens: int) -> None:
    """A prompt + completion batch longer than ``max_seq_length`` fails before its forward pass."""
    limit = model_max_seq_length(model)
    if limit is not None and n_tokens > limit:
        raise ValueError(
            f"a prompt + completion of {n_tokens} tokens exceeds the model's max_seq_length={limit}: shorten the "
            f"prompts in the dataset, lower max_completion_length, or load the model with a larger max_seq_length")
