"""The sampling settings a run's generator uses: the trainer config's, then ``generation_kwargs``, then the
keywords the user set in ``vllm_sampling_params`` (the order slimrl's engine and TRL's generators apply them)."""

from __future__ import annotations

from typing import Any

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")


def user_sampling_kwargs(params: Any) -> dict:
    """The keywords the user set: recorded by :func:`slimrl.vLLMSamplingParams`, a dict, or (a ``SamplingParams``
    built directly) the fields that differ from vLLM's defaults."""
    if params is None:
        return {}
    if isinstance(params, dict):
        return dict(params)
    recorded = getattr(params, "_slimrl_kwargs", None)
    if recorded is not None:
        return dict(recorded)
    fields = getattr(params, "__struct_fields__", ())
    default = type(params)()
    return {
        f: getattr(params, f) for f in fields if not f.startswith("_") and getattr(params, f) != getattr(default, f)
    }


def effective_sampling(args: Any) -> dict[str, Any]:
    """``temperature``, ``top_p``, ``top_k`` (0: off) and ``min_p`` (0: off) as the generator samples with them."""
    settings = {
        "temperature": getattr(args, "temperature", 1.0),
        "top_p": getattr(args, "top_p", 1.0),
        "top_k": getattr(args, "top_k", 0),
        "min_p": getattr(args, "min_p", 0.0),
    }
    for extra in (
        getattr(args, "generation_kwargs", None) or {},
        user_sampling_kwargs(getattr(args, "vllm_sampling_params", None)),
    ):
        settings.update({k: v for k, v in extra.items() if k in SAMPLING_KEYS and v is not None})
    settings["top_p"] = 1.0 if settings["top_p"] is None else settings["top_p"]
    settings["top_k"] = settings["top_k"] or 0
    settings["min_p"] = settings["min_p"] or 0.0
    return settings
