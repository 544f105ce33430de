"""``model.fast_generate`` without the vLLM engine: Hugging Face ``generate`` behind vLLM's ``LLM.generate`` surface.

Unsloth's notebooks try the trained adapter with ``model.fast_generate(text, sampling_params=SamplingParams(...),
lora_request=model.load_lora("grpo_saved_lora"))[0].outputs[0].text``. Without an engine this module gives the same
call and the same result shape: one :class:`RequestOutput` per prompt (``.prompt``, ``.prompt_token_ids``,
``.outputs[0].text`` / ``.token_ids``), the sampling settings mapped to ``generate``'s (temperature, top_p, top_k,
min_p, repetition_penalty, max_tokens, seed, stop strings, n), and ``lora_request`` an adapter saved with
``save_lora``: loaded once into the PEFT model under its own name, active only for that call. With
``lora_request=None`` the model generates as it is (its current adapter, as in training). A vision-language model
takes vLLM's multimodal form, ``{"prompt": text, "multi_modal_data": {"image": pil_image or [images]}}``: the prompt
and its images go through the model's processor, so the image reaches the model.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

# vLLM SamplingParams field -> transformers generate keyword
_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_tokens": "max_new_tokens",
    "n": "num_return_sequences",
}


@dataclass
class LoRARequest:
    """What ``load_lora`` returns without an engine (vLLM's ``LoRARequest`` fields)."""

    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)


def sampling_kwargs(params: Any) -> dict[str, Any]:
    """``generate`` keywords for vLLM ``SamplingParams`` (or slimrl's record of them, or a dict)."""
    if params is None:
        return {"max_new_tokens": 16, "do_sample": True}  # vLLM's defaults: 16 tokens, temperature 1
    if isinstance(params, dict):
        values = dict(params)
    else:
        values = dict(getattr(params, "_slimrl_kwargs", None) or {})
        for name in (*_SAMPLING, "seed", "stop"):
            if name not in values and getattr(params, name, None) is not None:
                values[name] = getattr(params, name)
    out: dict[str, Any] = {"max_new_tokens": 16}
    for src, dst in _SAMPLING.items():
        if values.get(src) is not None:
            out[dst] = values[src]
    temperature = values.get("temperature", 1.0)
    out["do_sample"] = temperature is None or temperature > 0
    if not out["do_sample"]:
        out.pop("temperature", None)
    if out.get("top_k") in (-1, 0):
        out["top_k"] = None  # vLLM's "no top-k"
    stop = values.get("stop")
    if stop:
        out["stop_strings"] = [stop] if isinstance(stop, str) else list(stop)
    if values.get("seed") is not None:
        out["seed"] = int(values["seed"])
    return out


def _adapter_name(request: Any) -> str:
    return f"slimrl_lora_{getattr(request, 'lora_int_id', 0)}"


def _activate(model: Any, request: Any) -> str | None:
    """Load ``request``'s adapter into the PEFT ``model`` (once) and make it the active one; returns the adapter
    that was active before (None when ``request`` is None)."""
    if request is None:
        return None
    if not hasattr(model, "load_adapter") or not hasattr(model, "peft_config"):
        raise ValueError("lora_request= needs a model with a LoRA adapter (FastLanguageModel.get_peft_model)")
    name = _adapter_name(request)
    if name not in model.peft_config:
        model.load_adapter(str(request.lora_path), adapter_name=name, is_trainable=False)
    previous = model.active_adapter
    model.set_adapter(name)
    return previous


MODALITIES = ("image",)  # multi_modal_data keys a vision-language model's processor takes here


def _encode(item: Any, tokenizer: Any, device: Any) -> tuple[str | None, list[int], dict[str, Any]]:
    """One vLLM input (a string, ``{"prompt_token_ids": [...]}`` or ``{"prompt": ..., "multi_modal_data": {...}}``)
    as (prompt text, prompt ids, ``generate`` inputs). Images go through the model's processor (the object
    ``from_pretrained`` returned); a model without one is refused in one line."""
    text_tok = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's text tokenizer, or the tokenizer itself
    if isinstance(item, dict) and "prompt_token_ids" in item:
        ids = [int(t) for t in item["prompt_token_ids"]]
        return None, ids, {"input_ids": torch.tensor([ids], device=device)}
    if isinstance(item, dict):
        if "prompt" not in item:
            raise ValueError(
                f"fast_generate: a prompt dict needs 'prompt' or 'prompt_token_ids' (got keys {sorted(item)})"
            )
        text, media = item["prompt"], dict(item.get("multi_modal_data") or {})
    else:
        text, media = item, {}
    unknown = sorted(set(media) - set(MODALITIES))
    if unknown:
        raise ValueError(
            f"fast_generate: multi_modal_data key {unknown[0]!r} is not taken here; pass "
            f"{', '.join(repr(m) for m in MODALITIES)}"
        )
    if media:
        if getattr(tokenizer, "image_processor", None) is None:
            raise ValueError(
                "fast_generate: an image was given but this model has no image processor (a text-only "
                "model); drop multi_modal_data or load a vision-language model with FastVisionModel"
            )
        images = media["image"] if isinstance(media["image"], list | tuple) else [media["image"]]
        inputs = tokenizer(text=[text], images=[images], return_tensors="pt")
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        return text, inputs["input_ids"][0].tolist(), inputs
    ids = text_tok(text, add_special_tokens=False)["input_ids"]
    return text, ids, {"input_ids": torch.tensor([ids], device=device)}


def hf_fast_generate(
    model: Any,
    tokenizer: Any,
    prompts: str | dict | list,
    sampling_params: Any = None,
    lora_request: Any = None,
    use_tqdm: bool = False,
    inference: Callable[[Any], AbstractContextManager] | None = None,
) -> list[RequestOutput]:
    """vLLM's ``LLM.generate`` surface over ``model.generate`` (see the module docstring); every input form vLLM takes
    (:func:`_encode`); ``inference(model)``: the context the model generates in (its owner's switch to inference mode
    and back; none by default)."""
    if tokenizer is None:
        raise ValueError("fast_generate needs the tokenizer FastLanguageModel.from_pretrained returned")
    items = [prompts] if isinstance(prompts, str | dict) else list(prompts)
    encoded = [_encode(item, tokenizer, model.device) for item in items]  # every input checked before generating
    text_tok = getattr(tokenizer, "tokenizer", tokenizer)
    kwargs = sampling_kwargs(sampling_params)
    seed = kwargs.pop("seed", None)
    stop = kwargs.get("stop_strings")
    previous = _activate(model, lora_request)
    mode = (inference or (lambda m: nullcontext()))(model)
    mode.__enter__()
    results = []
    try:
        for text, ids, inputs in encoded:  # one prompt at a time: no padding to reason about, as vLLM's outputs
            inputs.setdefault("attention_mask", torch.ones_like(inputs["input_ids"]))  # [1, P]
            if seed is not None:
                torch.manual_seed(seed)
            with torch.no_grad():
                out = model.generate(
                    **inputs, tokenizer=text_tok if stop else None, pad_token_id=text_tok.pad_token_id, **kwargs
                )  # [n, P + C]
            completions = []
            for index, row in enumerate(out[:, len(ids) :].tolist()):
                eos = text_tok.eos_token_id
                cut = row.index(eos) + 1 if eos in row else len(row)
                tokens = [t for t in row[:cut] if t != text_tok.pad_token_id or t == eos]
                completions.append(
                    CompletionOutput(
                        index,
                        text_tok.decode(tokens, skip_special_tokens=True),
                        tokens,
                        "stop" if eos in row else "length",
                    )
                )
            results.append(RequestOutput(text, ids, completions))
    finally:
        mode.__exit__(None, None, None)
        if previous is not None:
            model.set_adapter(previous)
    return results
