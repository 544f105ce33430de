"""Unsloth's model methods, on every model ``FastLanguageModel`` returns (plain or with its LoRA adapter):
``generate`` (transformers', in inference mode and back), ``fast_generate`` (the colocated engine when the model
has one, else Hugging Face ``generate`` behind the same call: :mod:`slimrl.generation.hf_generate`), ``save_lora`` /
``load_lora``, ``save_pretrained_merged``, ``save_pretrained_gguf``, ``push_to_hub_merged``, ``push_to_hub_gguf``
(:mod:`slimrl.export.api`)."""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from slimrl.compat.model_state import model_state
from slimrl.export import api

_LORA_IDS = itertools.count(1)


def _engine(model: Any) -> Any:
    from slimrl.generation.trl_backend import engine_of

    return engine_of(model)


def fast_generate(
    self: Any, prompts: str | list, sampling_params: Any = None, lora_request: Any = None, use_tqdm: bool = False
) -> list:
    """vLLM's ``LLM.generate``: through the engine when the model has one, else HF ``generate`` with the same
    sampling settings and adapter (:func:`slimrl.generation.hf_generate.hf_fast_generate`)."""
    engine = _engine(self)
    if engine is not None:
        return engine.fast_generate(prompts, sampling_params=sampling_params, lora_request=lora_request)
    from slimrl.generation.hf_generate import hf_fast_generate

    processor = model_state(self).processor
    return hf_fast_generate(
        self,
        processor or api._tokenizer(self, None),
        prompts,
        sampling_params,
        lora_request,
        use_tqdm,
        inference=_inference,
    )


@contextmanager
def _inference(model: Any) -> Iterator[None]:
    """The model in inference mode for a call, and back after (a model the user put there stays there)."""
    from slimrl.models.modes import for_inference, for_training, in_inference_mode, switch_window

    with switch_window() as may:  # a trainer step in another thread: its modes are left alone
        switch = may and not in_inference_mode(model)
        if switch:
            for_inference(model)
        try:
            yield
        finally:
            if switch:
                for_training(model)


def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' ``generate`` as Unsloth's models run it: in inference mode (eval, KV cache on, checkpointing
    off, left padding) and the training mode back after, so a notebook's try-it cell right after
    ``trainer.train()`` gets the trained model's own output (in training mode with checkpointing, transformers drops
    the KV cache: 5.19 then degenerates). Where a patched trainer's step generates (TRL sampling its completions),
    or the model is not training, transformers' call runs as it is; so it does from another thread while a trainer
    step runs (the step's modes are not touched; a step starting meanwhile waits for the switch back)."""
    from slimrl.models.modes import in_trainer_step

    original = type(self).generate
    if not self.training or in_trainer_step():
        return original(self, *args, **kwargs)
    with _inference(self):
        return original(self, *args, **kwargs)


def load_lora(self: Any, save_directory: str | Path, load_tensors: bool = False) -> Any:
    """What ``fast_generate``'s ``lora_request=`` takes for an adapter saved with ``save_lora``: vLLM's
    ``LoRARequest`` for the engine, slimrl's equivalent for HF ``generate``. ``load_tensors`` (Unsloth's: read the
    tensors now) changes nothing here: both load the adapter on its first use."""
    path = Path(save_directory)
    if not (path / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"load_lora({str(save_directory)!r}): no adapter_config.json there; pass a directory "
            f"written by model.save_lora"
        )
    lora_id = next(_LORA_IDS)
    if _engine(self) is not None:
        from vllm.lora.request import LoRARequest as VLLMLoRARequest

        return VLLMLoRARequest(f"slimrl-saved-{lora_id}", 10_000 + lora_id, str(path.resolve()))
    from slimrl.generation.hf_generate import LoRARequest

    return LoRARequest(f"slimrl-saved-{lora_id}", lora_id, str(path.resolve()))


def _bound(name: str, fn: Any) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **kwargs)

    method.__name__, method.__doc__ = name, fn.__doc__
    return method


METHODS = {
    "generate": generate,
    "fast_generate": fast_generate,
    "load_lora": load_lora,
    "save_lora": _bound("save_lora", api.save_lora),
    "save_pretrained_merged": _bound("save_pretrained_merged", api.save_pretrained_merged),
    "save_pretrained_gguf": _bound("save_pretrained_gguf", api.save_pretrained_gguf),
    "push_to_hub_merged": _bound("push_to_hub_merged", api.push_to_hub_merged),
    "push_to_hub_gguf": _bound("push_to_hub_gguf", api.push_to_hub_gguf),
}


def attach(model: Any) -> Any:
    """Bind :data:`METHODS` to ``model`` (instance attributes: the class and other models are untouched)."""
    for name, fn in METHODS.items():
        object.__setattr__(model, name, types.MethodType(fn, model))
    return model
