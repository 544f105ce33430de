"""Checks run before any compute when a patched trainer is built."""

from __future__ import annotations

from typing import Any

from slimrl.compat.runtime.callsite import warn


def model_max_seq_length(model: Any) -> int | None:
    """``max_seq_length`` recorded by ``FastLanguageModel.from_pretrained`` (None for other models)."""
    value = getattr(model, "max_seq_length", None)
    return value if isinstance(value, int) else None


def check_sequence_budget(model: Any, args: Any) -> None:
    """Prompt + completion lengths the config allows must fit ``max_seq_length``.

    The limit is the config's ``max_seq_length`` (slimrl's field) when set, which may not exceed the model's
    (``FastLanguageModel.from_pretrained(max_seq_length=...)``); unset, it becomes the model's. Uses
    ``max_completion_length`` and, where the TRL release has it, ``max_prompt_length``.
    """
    model_limit = model_max_seq_length(model)
    config_limit = getattr(args, "max_seq_length", None) if args is not None else None
    if config_limit is not None and model_limit is not None and config_limit > model_limit:
        raise ValueError(
            f"max_seq_length={config_limit} in the config is above the model's max_seq_length="
            f"{model_limit} (FastLanguageModel.from_pretrained): lower it, or load the model with a "
            f"larger max_seq_length"
        )
    if args is not None and config_limit is None and model_limit is not None and hasattr(args, "max_seq_length"):
        args.max_seq_length = model_limit  # unset: the model's
    limit = config_limit or model_limit
    if limit is None or args is None:
        return
    completion = getattr(args, "max_completion_length", None) or 0
    prompt = getattr(args, "max_prompt_length", None) or 0
    if completion + prompt >= limit:
        parts = f"max_completion_length={completion}" + (f" + max_prompt_length={prompt}" if prompt else "")
        raise ValueError(
            f"{parts} leaves no room for the prompt within the {'config' if config_limit else 'model'}'s "
            f"max_seq_length={limit} "
            f"(FastLanguageModel.from_pretrained): lower max_completion_length or load the model with a larger "
            f"max_seq_length"
        )


def check_batch_length(model: Any, n_tokens: int) -> None:
    """A prompt + completion batch longer than ``max_seq_length`` fails before its forward pass."""
    limit = model_max_seq_length(model)
    if limit is not None and n_tokens > limit:
        raise ValueError(
            f"a prompt + completion of {n_tokens} tokens exceeds the model's max_seq_length={limit}: shorten the "
            f"prompts in the dataset, lower max_completion_length, or load the model with a larger max_seq_length"
        )


# ---------------------------------------------------------------- config checks (before TRL builds the config)


def _world_size() -> int:
    import os

    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def unsloth_refusals(values: dict) -> list[str]:
    """What Unsloth's configs refuse and TRL's accept, for these config values: a learning rate below 0 (torch's
    optimizer refuses it later), a temperature outside (0, 10] (0 divides by zero), a ``max_completion_length``
    below 1. The library warns (TRL accepts them, so slimrl does); ``slimrl train`` refuses them."""
    found = []
    lr = values.get("learning_rate")
    if lr is not None and float(lr) < 0:
        found.append(f"learning_rate={lr} is invalid: it must be >= 0 (e.g. 1e-5 for LoRA; 0 trains nothing)")
    temperature = values.get("temperature")
    if temperature is not None and not 0 < float(temperature) <= 10:
        found.append(
            f"temperature={temperature} is invalid: it must be > 0 and <= 10 (1.0 samples from the model "
            f"as it is; 0.6-1.0 is usual for GRPO)"
        )
    completion = values.get("max_completion_length")
    if completion is not None and int(completion) < 1:
        found.append(
            f"max_completion_length={completion} is invalid: it must be >= 1 (the tokens each completion may have)"
        )
    return found


def warn_unsloth_refusals(values: dict) -> None:
    for message in unsloth_refusals(values):
        warn(f"{message}; Unsloth refuses this, TRL accepts it, so slimrl does too", UserWarning)


def check_learning_rate(kwargs: dict, defaults: dict) -> None:
    """Every patched config: ``learning_rate`` below 0, or outside [1e-7, 1] (0 included), is a warning (almost
    surely a typo, not impossible; TRL accepts it)."""

    lr = kwargs.get("learning_rate", defaults.get("learning_rate"))
    if lr is None:
        return
    if float(lr) < 0:
        warn_unsloth_refusals({"learning_rate": lr})
    elif not 1e-7 <= float(lr) <= 1:
        warn(f"learning_rate={lr} is outside [1e-7, 1]: check it (LoRA usually runs at 5e-6 to 5e-4)", UserWarning)


def check_grpo_config_kwargs(kwargs: dict, defaults: dict) -> dict:
    """Checks on ``GRPOConfig(...)`` / ``RLOOConfig(...)`` keywords that need no compute; returns the (possibly
    adjusted) keywords.

    * ``temperature`` outside (0, 10] and ``max_completion_length`` below 1: a warning (Unsloth refuses them; TRL
      accepts them: :func:`unsloth_refusals`).
    * ``per_device_train_batch_size x gradient_accumulation_steps x world size`` not a multiple of
      ``num_generations`` (and no explicit ``generation_batch_size`` / ``steps_per_generation``): the batch size
      is set to ``num_generations``, with a warning saying so (Unsloth's behaviour, so that
      ``per_device_train_batch_size=1, num_generations=8`` runs).
    * ``unsloth_grpo_mini_batch`` larger than the generation batch: ValueError.

    ``defaults``: the config class's field defaults (for the values the user did not pass).
    """

    def get(name):
        return kwargs.get(name, defaults.get(name))

    warn_unsloth_refusals({"temperature": get("temperature"), "max_completion_length": get("max_completion_length")})
    n_gen = get("num_generations")
    explicit_generation = (
        kwargs.get("generation_batch_size") is not None or kwargs.get("steps_per_generation") is not None
    )
    batch, accum = get("per_device_train_batch_size") or 1, get("gradient_accumulation_steps") or 1
    if n_gen and not explicit_generation and (batch * accum * _world_size()) % n_gen != 0:
        warn(
            f"per_device_train_batch_size={batch} x gradient_accumulation_steps={accum} x "
            f"{_world_size()} process(es) is not a multiple of num_generations={n_gen}: slimrl set "
            f"per_device_train_batch_size={n_gen} (one prompt's {n_gen} completions per device step)",
            UserWarning,
        )
        kwargs = {**kwargs, "per_device_train_batch_size": n_gen}
        batch = n_gen
    mini = kwargs.get("unsloth_grpo_mini_batch")
    generation_batch = kwargs.get("generation_batch_size") or batch * (kwargs.get("steps_per_generation") or accum)
    if mini is not None and (not isinstance(mini, int) or isinstance(mini, bool) or not 1 <= mini <= generation_batch):
        raise ValueError(
            f"unsloth_grpo_mini_batch={mini} is invalid: use an int from 1 to the generation batch "
            f"({generation_batch} = per_device_train_batch_size x steps_per_generation) or None"
        )
    return kwargs


# ---------------------------------------------------------------- trainer checks (before TRL builds the trainer)


def check_precision(model: Any, args: Any) -> None:
    """A float16 model with ``bf16=True`` written by the user (or a bfloat16 model with ``fp16=True``): a warning
    (Unsloth refuses it with a TypeError: autocast in the other half-precision format is almost surely a mistake;
    TRL trains it, so slimrl does too). TRL's own default (``bf16`` left unset) says nothing."""
    import torch

    if model is None or args is None or isinstance(model, str):
        return
    from slimrl.patching.every_trainer.state import config_state

    explicit = config_state(args).explicit
    dtype = getattr(model, "dtype", None)
    if dtype == torch.float16 and getattr(args, "bf16", False) and "bf16" in explicit:
        warn(
            "the model is float16 but the config has bf16=True: set bf16=False, fp16=True, or load the model with "
            "dtype=torch.bfloat16 (Unsloth refuses this; TRL trains it, so slimrl does too)",
            UserWarning,
        )
    if dtype == torch.bfloat16 and getattr(args, "fp16", False) and "fp16" in explicit:
        warn(
            "the model is bfloat16 but the config has fp16=True: set fp16=False, bf16=True, or load the model with "
            "dtype=torch.float16 (Unsloth refuses this; TRL trains it, so slimrl does too)",
            UserWarning,
        )


def check_dataset(dataset: Any, argument: str = "train_dataset") -> None:
    """The dataset must be one split with rows (its columns: :func:`check_layout`)."""
    if dataset is None:
        return
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, dict):  # DatasetDict
        raise ValueError(
            f"{argument} is a DatasetDict with splits {', '.join(columns)}: pass one split, e.g. dataset['train']"
        )
    try:
        empty = len(dataset) == 0
    except TypeError:  # IterableDataset: no length to check
        empty = False
    if empty:
        raise ValueError(f"{argument} is empty: pass a dataset with at least one row")


def sft_layouts(args: Any) -> tuple[tuple[str, ...], ...]:
    """SFTTrainer's layouts: its ``dataset_text_field`` (``"text"``), ``messages`` / ``conversations`` (chat),
    ``prompt`` + ``completion``, or pre-tokenized ``input_ids``."""
    text = getattr(args, "dataset_text_field", None) or "text"
    return ((text,), ("messages",), ("conversations",), ("prompt", "completion"), ("input_ids",))


def check_layout(
    dataset: Any,
    trainer: str | None,
    layouts: tuple[tuple[str, ...], ...],
    args: Any = None,
    formatting_func: Any = None,
    argument: str = "train_dataset",
) -> None:
    """``dataset`` holds every column of one of the ``layouts`` the TRL trainer named ``trainer`` accepts
    (:func:`slimrl.patching.table.trainer_layouts`). Not checked where TRL itself takes any columns: SFT with a
    ``formatting_func`` or ``dataset_kwargs={"skip_prepare_dataset": True}``, and datasets without column names
    (iterable ones)."""
    columns = getattr(dataset, "column_names", None)
    if not layouts or not isinstance(columns, list):
        return
    if trainer == "SFTTrainer" and (
        formatting_func is not None or (getattr(args, "dataset_kwargs", None) or {}).get("skip_prepare_dataset")
    ):
        return
    if any(all(c in columns for c in layout) for layout in layouts):
        return
    if len(layouts) == 1 and len(layouts[0]) == 1:
        (wanted,) = layouts[0]
        raise ValueError(
            f"{argument} has no {wanted!r} column (columns: {', '.join(columns) or 'none'}): rename the "
            f"column holding the {wanted}s to {wanted!r}"
        )
    wanted = " or ".join("(" + ", ".join(repr(c) for c in layout) + ")" for layout in layouts)
    raise ValueError(
        f"{argument} has columns ({', '.join(columns) or 'none'}) but {trainer} reads {wanted}: rename "
        f"the columns to that layout (TRL's dataset formats: "
        f"https://huggingface.co/docs/trl/dataset_formats)"
    )
