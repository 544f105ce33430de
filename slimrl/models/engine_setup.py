"""The colocated engine ``from_pretrained(fast_inference=True)`` attaches: whether one can run here, its KV-cache
dtype, vLLM's start-up check before any weight loads (a GPU), and one engine per process.

On a GPU, slimrl's engine starts beside the training model and uses its weights in place
(:mod:`slimrl.generation.shared_loader`), so the memory at its start is the card's less the CUDA context, the
training model's weights and its adapter; :func:`start_on_gpu` computes the engine's arguments for those numbers and
runs vLLM's own check on them (:mod:`slimrl.compat.engine_memory`). ``from_pretrained`` asks it before loading
anything, so a notebook whose ``gpu_memory_utilization`` cannot start on this card stops at its first cell with one
line saying what to change, instead of inside vLLM after the weights loaded; ``slimrl plan --gpu`` asks it for a card
the user does not have.

vLLM's sleep-mode memory pool allows one engine per process on a GPU: a second ``from_pretrained(fast_inference=True)``
of the same model and settings (a re-run notebook cell) gets the engine already there; another model while that
engine is alive on the GPU is refused in one line. (vLLM's CPU back end runs several: each load gets its own.)
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from slimrl.compat.engine_memory import (
    MAX_NUM_SEQS,
    EngineStart,
    auto_kv_bytes,
    cuda_engine_start,
    fix_for,
    startup_problem,
)
from slimrl.compat.gpus import CUDA_CONTEXT_BYTES, Gpu, current_gpu
from slimrl.compat.runtime.callsite import warn
from slimrl.compat.vllm_info import kv_bytes_per_token, vllm_status, vllm_version_note
from slimrl.generation.engine import SlimrlEngine
from slimrl.models import unsloth_keywords
from slimrl.models.sizes import adapter_bytes, weight_bytes

_LIVE: weakref.WeakValueDictionary[tuple, SlimrlEngine] = weakref.WeakValueDictionary()


def engine_problem(fast_inference: bool, vision: bool) -> str | None:
    """Why ``fast_inference=True`` gets no engine here (None: it gets one, or it was not asked for); an engine on a
    vLLM outside the tested releases gets one line saying so (:func:`slimrl.compat.vllm_info.vllm_version_note`)."""
    if not fast_inference:
        return None
    problem = vllm_status()
    if problem is None and vision:
        problem = "slimrl's engine does not serve vision-language models yet"
    note = vllm_version_note() if problem is None else None
    if note is not None:
        warn(f"fast_inference=True: {note}")
    return problem


def kv_cache_dtype(float8_kv_cache: bool, engine: bool) -> str:
    """``"fp8"`` where ``float8_kv_cache=True`` can run (an engine on a GPU with fp8: compute capability >= 8.9),
    else ``"auto"`` (with one line when fp8 was asked for)."""
    gpu = current_gpu()
    if float8_kv_cache and engine and gpu is not None and gpu.fp8:
        return "fp8"
    if float8_kv_cache:
        why = (
            "there is no vLLM engine (fast_inference)"
            if not engine
            else "vLLM's CPU backend has no fp8 KV cache"
            if gpu is None
            else f"the {gpu.name} has no fp8 (compute capability {gpu.capability})"
        )
        unsloth_keywords.note(f"from_pretrained(float8_kv_cache=True) ignored: {why}")
    return "auto"


def start_on_gpu(
    gpu: Gpu,
    config: Any,
    utilization: float | str,
    max_seq_length: int,
    load_in_4bit: bool,
    max_lora_rank: int,
    free: int | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[EngineStart, str | None, int]:
    """(the engine's arguments, vLLM's start-up verdict — None: it starts — and the base weights' bytes on the card,
    held once) for a model of ``config`` on ``gpu``; ``free``: what is free before the model loads (default: the
    card less the CUDA context)."""
    dtype = dtype or gpu.dtype
    weights = weight_bytes(config, dtype, load_in_4bit)
    adapter = adapter_bytes(config, max_lora_rank)
    free_at_start = (gpu.total_bytes - CUDA_CONTEXT_BYTES if free is None else free) - weights - adapter
    kv = None
    if utilization == "auto":
        per_token = kv_bytes_per_token(config, dtype)
        kv = auto_kv_bytes(free_at_start, adapter, per_token, MAX_NUM_SEQS * max_seq_length)
        if kv is None:
            start = cuda_engine_start(0.99, free_at_start, gpu.total_bytes, weights)
            return start, "too little memory left for the KV cache beside the model and its adapter", weights
    start = cuda_engine_start(utilization, free_at_start, gpu.total_bytes, weights, kv)
    return start, startup_problem(start), weights


def check_before_loading(
    path: str, utilization: float | str, max_seq_length: int, load_in_4bit: bool, max_lora_rank: int, dtype: torch.dtype
) -> None:
    """On a GPU: vLLM's start-up check for this load, before any weight loads; one-line ValueError when it fails."""
    gpu = current_gpu()
    if gpu is None:
        return
    from transformers import AutoConfig

    from slimrl.compat.memory import free_bytes_as_vllm_measures

    config = AutoConfig.from_pretrained(path)
    free = free_bytes_as_vllm_measures(torch.device("cuda", torch.cuda.current_device()))
    start, problem, _ = start_on_gpu(gpu, config, utilization, max_seq_length, load_in_4bit, max_lora_rank, free, dtype)
    if problem:
        raise ValueError(
            f"fast_inference=True with gpu_memory_utilization={utilization!r} cannot start vLLM on this "
            f"{gpu.name} beside the model ({problem}); {fix_for(start)}"
        )


# vLLM's fp8 linear method runs from this compute capability (its Fp8Config.get_min_capability(), 75 in 0.32: the
# Marlin kernel, weight-only FP8 below 8.9); W8A8 needs fp8 arithmetic (Gpu.fp8, vLLM's supports_fp8: 8.9)
FP8_MIN_CAPABILITY = (7, 5)


def engine_quantization(load_in_fp8: bool, engine: bool) -> str | None:
    """vLLM's ``quantization`` for the engine: ``"fp8"`` where ``load_in_fp8=True`` runs (a GPU at compute capability
    >= 7.5; weight-only below 8.9, said in one line), else None (16-bit, with one line when fp8 was asked for)."""
    if not load_in_fp8:
        return None
    gpu = current_gpu()
    if engine and gpu is not None and gpu.capability >= FP8_MIN_CAPABILITY:
        if not gpu.fp8:
            unsloth_keywords.note(
                f"from_pretrained(load_in_fp8=True): the {gpu.name} has no fp8 arithmetic (compute "
                f"capability {gpu.capability}): vLLM runs weight-only FP8 (its Marlin kernel)"
            )
        return "fp8"
    why = (
        "there is no vLLM engine (fast_inference)"
        if not engine
        else "vLLM's CPU backend runs no fp8 weights"
        if gpu is None
        else f"vLLM's FP8 needs compute capability >= 7.5 (the {gpu.name}: {gpu.capability})"
    )
    unsloth_keywords.note(f"from_pretrained(load_in_fp8=True): {why}; the engine runs in 16-bit")
    return None


def attach_engine(
    model: Any,
    path: str,
    max_seq_length: int,
    max_lora_rank: int,
    utilization: float | str,
    seed: int,
    kv_dtype: str,
    full_finetuning: bool = False,
    quantization: str | None = None,
) -> SlimrlEngine:
    """``model.vllm_engine``: the engine of this process for these settings (module docstring), bound to ``model``
    (a generation before any trainer runs on its weights); ``quantization``: vLLM's for the engine's weights
    (``"fp8"``: :func:`engine_quantization`)."""
    base_quant = getattr(getattr(model, "config", None), "quantization_config", None)  # a 4-bit base is another
    key = (
        path,
        str(model.dtype),
        str(base_quant),
        quantization,
        max_seq_length,
        max_lora_rank,
        str(utilization),
        kv_dtype,
    )
    engine = _LIVE.get(key) if torch.cuda.is_available() else None  # vLLM's CPU back end runs several
    if engine is None:
        started = [e for e in _LIVE.values() if e.llm is not None and e.device.type == "cuda"]
        if started:
            raise ValueError(
                f"fast_inference=True: this process already runs vLLM's engine for "
                f"{started[0].model_path!r} (vLLM's memory pool allows one per process); restart the "
                f"runtime, or load that model again with the same settings to reuse its engine"
            )
        engine = SlimrlEngine(
            path,
            model.dtype,
            max_seq_length,
            max_lora_rank,
            utilization,
            seed=seed,
            kv_cache_dtype=kv_dtype,
            quantization=quantization,
        )
        _LIVE[key] = engine
    trainable = (
        sum(p.numel() * p.element_size() for p in model.parameters())
        if full_finetuning
        else adapter_bytes(model.config, max_lora_rank)
    )
    engine.bind(model, trainable)
    model.vllm_engine = engine
    return engine
