"""What slimrl records on a model it loads: one typed record, one attribute, one accessor.

``FastLanguageModel.from_pretrained`` sets it; ``get_peft_model`` carries it (and the model attributes transformers
and TRL read: ``max_seq_length``, ``vllm_engine``) over to the PEFT model in one place (:func:`carry_over`); the
export, the generation modes, the lean default and the checkpointing read it through :func:`model_state`. It lives
at the bottom of the layers because every layer above reads it (the export cannot import the models layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ATTRIBUTE = "slimrl_state"
CARRIED = ("max_seq_length", "vllm_engine")  # plain model attributes other libraries read, carried with the record


@dataclass
class ModelState:
    """slimrl's record of one loaded model."""

    model_path: str | None = None  # what from_pretrained loaded (the export finds SentencePiece files there)
    max_lora_rank: int | None = None  # the engine's largest servable rank: get_peft_model refuses a larger r
    full_finetuning: bool = False  # loaded for full fine-tuning: get_peft_model adds no adapter
    vision: bool = False  # a vision-language model (the adapter's default targets, processors)
    tiled_mlp: bool | None = None  # what the user asked for (None: not asked, the lean default decides)
    fused_lora: bool | None = None  # get_peft_model's fused_lora (None: not through it; a trainer fuses TRL's adapter)
    checkpointing_default: Any = None  # from_pretrained's use_gradient_checkpointing, get_peft_model's default
    checkpointing: Any = None  # the mode get_peft_model set (generation switches it off and back)
    checkpointing_chosen: bool = False  # that mode is slimrl's default (none given): the lean default may unload it
    tokenizer: Any = None  # the text tokenizer (padding side switched by for_inference / for_training)
    processor: Any = None  # a vision model's processor (fast_generate's images)


def _base(model: Any) -> Any:
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def model_state(model: Any) -> ModelState:
    """The model's record (a PEFT model's, or its base model's); an empty one, not attached, for a model slimrl
    did not load."""
    for holder in (model, _base(model)):
        state = getattr(holder, "__dict__", {}).get(ATTRIBUTE)
        if isinstance(state, ModelState):
            return state
    return ModelState()


def attach_state(model: Any, state: ModelState) -> ModelState:
    """``state`` as the model's record."""
    setattr(model, ATTRIBUTE, state)
    return state


def carry_over(source: Any, target: Any) -> None:
    """``target`` (the PEFT model built on ``source``) gets ``source``'s record and :data:`CARRIED` attributes."""
    if isinstance(getattr(source, "__dict__", {}).get(ATTRIBUTE), ModelState):
        attach_state(target, source.__dict__[ATTRIBUTE])
    for name in CARRIED:
        if hasattr(source, name):
            setattr(target, name, getattr(source, name))


def lora_rank(model: Any) -> int:
    """The rank of a PEFT model's first adapter (0: no adapter)."""
    peft = getattr(model, "peft_config", None) or {}
    return next(iter(peft.values())).r if peft else 0
