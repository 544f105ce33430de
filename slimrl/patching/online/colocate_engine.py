"""TRL's own colocate path (``use_vllm=True, vllm_mode="colocate"``, a model TRL loaded by name with a
``peft_config``: TRL's rloo.py and grpo.py example scripts) served by a slimrl engine built for the trainer's model.

TRL starts its own ``vllm.LLM`` and, every optimizer step, merges the adapter into the base and pushes every base
weight through vLLM's ``load_weights``. On vLLM's CPU build that call stops (``'Parameter' object has no attribute
'weight_loader'``: the CPU back end repacks its linear weights after loading), with or without slimrl. slimrl's
engine (:class:`slimrl.generation.engine.SlimrlEngine`) instead builds vLLM on the training model's own base weights
(one copy) and syncs only the adapter, the path ``fast_inference=True`` takes; the sampling settings are TRL's
(every argument TRL passes its generator), so the completions follow the same distribution, and TRL's
importance-sampling correction still compares the engine's log-probs with the trainer's.

The engine's settings come from TRL's arguments: ``vllm_gpu_memory_utilization``, ``vllm_max_model_length``
(default: the model's ``max_position_embeddings``, vLLM's own default), ``max_num_seqs``, the adapter's rank (vLLM's
next supported LoRA rank) and TRL's seed (the process index). Where it cannot serve — no LoRA adapter (TRL merges
nothing then), tensor parallelism, a model whose checkpoint path is unknown, a vision-language model — TRL's own
class runs unchanged.
"""

from __future__ import annotations

from typing import Any

from slimrl.compat.runtime.callsite import warn
from slimrl.compat.vllm_info import supported_lora_rank, vllm_status


def _checkpoint(base: Any) -> str | None:
    path = getattr(getattr(base, "config", None), "_name_or_path", None) or getattr(base, "name_or_path", None)
    return str(path) if path else None


def colocate_engine(peft_model: Any, kwargs: dict) -> Any:
    """A slimrl engine for ``peft_model`` (a PEFT model without one) in place of TRL's colocated ``vllm.LLM``, or
    None where it cannot serve (module docstring). ``kwargs``: what TRL passed its ``VLLMGeneration``."""
    from slimrl.models import engine_setup
    from slimrl.models.vision import is_vision_language

    if kwargs.get("tensor_parallel_size", 1) != 1 or vllm_status() is not None:
        return None
    base = peft_model.get_base_model()
    path = _checkpoint(base)
    if path is None or is_vision_language(base.config):
        return None
    ranks = [int(getattr(c, "r", 0) or 0) for c in getattr(peft_model, "peft_config", {}).values()]
    if not ranks or min(ranks) <= 0:
        return None
    text = getattr(base.config, "text_config", None) or base.config
    max_len = (
        kwargs.get("max_model_length")
        or getattr(base, "max_seq_length", None)
        or getattr(text, "max_position_embeddings", None)
    )
    if not max_len:
        return None
    engine = engine_setup.attach_engine(
        base,
        path,
        int(max_len),
        supported_lora_rank(max(ranks)),
        float(kwargs.get("gpu_memory_utilization", 0.9)),
        seed=0,
        kv_dtype="auto",
    )
    if kwargs.get("max_num_seqs"):
        engine.max_num_seqs = kwargs["max_num_seqs"]
    warn(
        f"use_vllm=True (colocate): slimrl's engine generates for {path!r} on the training model's own base "
        f"weights and syncs only the adapter each step (TRL's merge-and-load_weights sync stops on vLLM's CPU "
        f"build and copies every weight); the sampling settings are TRL's"
    )
    return engine
