"""``slimrl.plan``: predicted peak memory per phase and step time of a training run, before any weight loads.

Memory (bytes) = runtime + weights + adapter state + the largest phase, where

* **runtime**: on CPU the resident size of a fresh process that has imported what a training process imports
  (measured once with the calibration, :mod:`slimrl.planning.timing`); on CUDA the CUDA context
  (:data:`slimrl.compat.gpus.CUDA_CONTEXT_BYTES`), shown as a phase but left out of ``peak_bytes``, which on CUDA is
  the predicted ``max_memory_allocated`` (the context is outside it; the verdict counts it against the budget);
* **weights**: every parameter of the model built from its config on the meta device, in the load dtype (fp32 on
  CPU, bf16 on CUDA) or NF4 (0.516 bytes per parameter of the decoder's linear layers, the rest 16-bit);
* **adapter**: LoRA parameters (fp32) + their gradients + AdamW's two moments = 16 bytes per LoRA parameter; full
  fine-tuning (``lora_r=0``): AdamW's two moments in the weights' dtype (what ``torch.optim.AdamW`` keeps), the
  gradients being counted by the trace as the backward creates them;
* **reference**: full fine-tuning with a reference model (DPO, KTO; GRPO/RLOO with ``beta > 0``): TRL's frozen copy,
  in the float32 TRL builds it in (:mod:`slimrl.planning.phases`);
* **engine** (``fast_inference`` on CPU): what the started vLLM engine keeps for the rest of the run, its packed
  linear copies and LoRA slots computed, its runtime measured once per machine and shape
  (:mod:`slimrl.planning.engine_cpu`); on CUDA the engine shares every base weight and its KV cache is the phase;
* **phases**, each measured by running slimrl's code path on the meta device (:mod:`slimrl.planning.trace`):
  ``generation`` (HF generate: the prefill's peak or the KV cache of the whole sequence plus one layer's regrowth;
  the engine: its KV cache, as slimrl sizes it on CUDA; on CPU the pages generation writes, rows x (prompt +
  completion) tokens: vLLM's CPU KV cache is allocated uninitialised, measured), ``logprobs_no_grad``
  (old/reference passes, ``unsloth_grpo_mini_batch`` rows at a time), ``policy_forward`` (what the forward keeps
  for the backward under the checkpointing policy) and ``backward`` (the peak of forward + backward: recompute and
  head chunks included). On CUDA, slimrl's checkpointing (``"slimrl"``) keeps the layer inputs in host memory
  (:mod:`slimrl.models.offload`): all but two layers' inputs (the one recomputed and the one copied ahead) leave
  both phases for ``host_pinned_bytes`` (its pool's buffers, a note past its share of the host's RAM).

**Shared-prefix layout** (``Settings.shared_prefix``, slimrl's ``slimrl_shared_prefix``, default on; a trainer whose
workload declares it, a model it applies to: :func:`shared_prefix_applies`): a log-prob pass over ``n`` rows of
groups of ``G`` runs ``ceil(n / G)`` packed rows of ``P + min(n, G) * C`` tokens; traced as such, plus the one
layer's gathered prompt keys and values the attention of :mod:`slimrl.ops.prefix_attention` holds while it runs.

No allocator factor in the prediction: on CUDA it is of allocated bytes (``max_memory_allocated``, the caching
allocator's reserve not included), and whether that fits a card is :mod:`slimrl.planning.verdict`'s three-way answer,
which the searches and auto-fit use too; on CPU slimrl returns freed blocks to the OS during the gradient passes
(:mod:`slimrl.compat.runtime.malloc`): resident size tracked live bytes within ``bench/plan_accuracy.py``'s error. Time:
:mod:`slimrl.planning.timing`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch

from slimrl.compat.gpus import CUDA_CONTEXT_BYTES, current_gpu, find_gpu
from slimrl.compat.quant import NF4_BYTES
from slimrl.errors import InputError
from slimrl.planning.bounds import parse_budget
from slimrl.planning.config import load_config
from slimrl.planning.gpu import cuda_total
from slimrl.planning.levers import choose
from slimrl.planning.phases import (
    pinnable_bytes,
    pinned_host_bytes,
    prefix_gather_bytes,
    reference_bytes,
    shared_prefix_applies,
)
from slimrl.planning.search import PERSISTENT, fastest_fitting, largest_phase, longest_fitting
from slimrl.planning.settings import CHECKPOINTING, Settings, Workload, _check  # noqa: F401 - re-exported
from slimrl.planning.timing import DEFAULT_GPU, calibrate, no_grad_passes, offload_seconds, packed, step_split
from slimrl.planning.verdict import fitting_bytes, verdict


@dataclass
class Plan:
    """What :func:`plan` predicts (bytes and seconds); ``to_json`` gives the ``slimrl plan --json`` object."""

    settings: dict[str, Any]
    peak_bytes: int
    phases: dict[str, int]
    step_seconds: float
    step_split: dict[str, float]
    fits: bool | None = None  # the verdict is "fits" (slimrl.planning.verdict)
    verdict: str | None = None  # "fits", "uncertain — measure with slimrl compare" or "does not fit"
    budget_bytes: int | None = None
    recommended: dict[str, Any] | None = None
    max_completion_length_that_fits: int | None = None
    notes: list[str] = field(default_factory=list)
    host_pinned_bytes: int = 0  # offloaded layer inputs in host memory (CUDA, slimrl's checkpointing)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.budget_bytes is None:  # the budget's answers only when a budget was given (then also when None)
            for key in ("fits", "verdict", "budget_bytes", "recommended", "max_completion_length_that_fits"):
                data.pop(key)
        return data


def _shape(config: Any) -> dict[str, int]:
    text = getattr(config, "text_config", None) or config
    return {
        "layers": text.num_hidden_layers,
        "hidden": text.hidden_size,
        "vocab": text.vocab_size,
        "intermediate": getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
    }


def _checkpoint_every(s: Settings) -> int:
    """The checkpointing period of the settings: 0 off, 1 every layer, n every n-th (selective, default 2)."""
    mode = s.gradient_checkpointing
    return 0 if mode == "false" else (s.checkpoint_every_n_layers or 2) if mode == "selective" else 1


NOT_REPORTED = ("gpu_memory_utilization", "chunk_rows", "host_pinning")


def _as_json(s: Settings) -> dict[str, Any]:
    """The settings as :class:`Plan` reports them (the engine's share and the head's chunk rows are inputs of the
    prediction, not reported)."""
    return {f.name: getattr(s, f.name) for f in fields(s) if f.name not in NOT_REPORTED}


def _weights(model: Any, load_in_4bit: bool, dtype: torch.dtype) -> tuple[int, int, int]:
    """(weight bytes, non-embedding parameters, LoRA parameters)."""
    size = torch.tensor([], dtype=dtype).element_size()
    weight_bytes = params = lora = 0
    embed = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    counted: set[int] = set()  # a tied head is the embedding's parameter: once
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in counted:
                continue
            counted.add(id(p))
            if "lora_" in name or "lora_" in pname:
                lora += p.numel()
                continue
            quantized = load_in_4bit and isinstance(module, torch.nn.Linear) and ".layers." in f".{name}."
            weight_bytes += int(p.numel() * (NF4_BYTES if quantized else size))
            if id(p) not in embed:
                params += p.numel()
    return weight_bytes, params, lora


def plan(
    model: Any = "SmolLM2-135M-Instruct",
    settings: Settings | None = None,
    *,
    budget: str | int | None = None,
    search: bool = True,
) -> Plan:
    """Predict a run's peak memory per phase and its step time (see the module docstring); with ``budget``, whether
    it fits, the fastest settings that fit and the longest completion that fits. ``model``: a name
    (:func:`slimrl.planning.config.load_config`) or a transformers config object."""
    settings = settings or Settings()
    config = None if isinstance(model, str) else model  # a transformers config object (auto-fit passes the model's)
    name = model if config is None else getattr(config, "_name_or_path", "") or type(config).__name__
    settings = replace(settings, gradient_checkpointing=str(settings.gradient_checkpointing).lower())
    _check(settings)
    config = config if config is not None else load_config(model)
    budget_bytes, tiling = parse_budget(budget), []
    if budget_bytes is None and settings.gpu:  # a named card: its memory is the budget
        budget_bytes = find_gpu(settings.gpu).total_bytes
    settings, tiling = _lean_default(config, settings, budget_bytes)  # slimrl.planning.levers
    settings = replace(settings, shared_prefix=shared_prefix_applies(config, settings))  # asked for -> runs
    result = _predict(config, settings)
    result.settings = {"model": name, **result.settings}
    result.notes += tiling
    if budget_bytes is None:
        return result
    result.budget_bytes, device = budget_bytes, settings.device
    judged = verdict(result.peak_bytes, budget_bytes, device)
    result.fits, result.verdict = judged.fits, judged.word
    result.notes.insert(0, judged.line())
    floor = result.phases["weights"] + result.phases["runtime"]
    if floor > budget_bytes and budget is not None:  # a card too small for the weights is its verdict, not an error
        raise InputError(
            f"--budget {budget}: below the weights and runtime alone ({floor / 2**30:.2f} GiB); "
            f"raise the budget{'' if settings.load_in_4bit else ' or pass --load_in_4bit true'}"
        )
    if search and floor <= budget_bytes:
        aim = fitting_bytes(budget_bytes, device)  # the largest peak whose verdict is "fits"
        result.recommended = _fastest_fitting(config, settings, aim)
        result.max_completion_length_that_fits = _longest_fitting(config, settings, aim)
        if not result.fits:
            fix = (
                f"use {result.recommended}"
                if result.recommended
                else f"max_completion_length <= {result.max_completion_length_that_fits}"
                if result.max_completion_length_that_fits
                else "a smaller batch or a 4-bit base"
            )
            result.notes.append(f"to fit: {(result.peak_bytes - aim) / 2**30:.2f} GiB less; {fix}")
    return result


def _lean_default(config: Any, s: Settings, budget: int | None) -> tuple[Settings, list[str]]:
    """``s`` with slimrl's defaults for the levers left to it (``tiled_mlp`` None, ``gradient_checkpointing``
    "auto"): on CUDA under checkpointing each applied only while the peak is above what fits ``budget`` (no budget
    given: the default GPU's memory), cheapest seconds per GiB first (:mod:`slimrl.planning.levers`); the notes say
    what was applied. On a CPU "auto" is slimrl's checkpointing (plain there) and nothing is tiled."""
    levers = ("tiled_mlp",) if s.tiled_mlp is None else ()
    levers += ("offload",) if s.gradient_checkpointing == "auto" else ()
    s = replace(s, tiled_mlp=False if s.tiled_mlp is None else s.tiled_mlp)
    if s.gradient_checkpointing == "auto":
        s = replace(s, gradient_checkpointing="true" if s.device == "cuda" else "slimrl")
    if s.device != "cuda" or s.gradient_checkpointing == "false" or not levers:
        return s, []
    budget = budget if budget is not None else find_gpu(DEFAULT_GPU).total_bytes
    chosen, applied, _ = choose(s, levers, fitting_bytes(budget, "cuda"), lambda st: _peak_and_seconds(config, st))
    return chosen, [f"slimrl's default applied {p.note()}: {p.why()}" for p in applied]


def _cuda_passes(config: Any, s: Settings, split: dict[str, float], rows: int, every: int, gpu: Any) -> None:
    """On CUDA the log-prob passes and the backward in ``split`` from the training pass's time model
    (:mod:`slimrl.planning.cuda_pass`, the one ``--compare`` prices each side with): its seconds over its passes
    (forward, recompute, backward as two forwards) give the forward; a no-grad pass costs one forward."""
    from slimrl.planning.cuda_pass import run_shape, slimrl_kernels, train_seconds

    recompute = (1.0 / every) if every else 0.0
    total = sum(
        train_seconds(
            config,
            gpu,
            **run_shape(s, rows),
            recompute=recompute,
            kernels=slimrl_kernels(bool(s.fused_lora and s.lora_r)),
            shared_prefix=s.shared_prefix,
            tiled=bool(s.tiled_mlp),
        ).values()
    )
    forward = total / (1 + recompute + 2)
    if "logprobs_no_grad" in split:
        split["logprobs_no_grad"] = no_grad_passes(s) * forward
    split["policy_forward"], split["backward"] = forward, total - forward


def _peak_and_seconds(config: Any, s: Settings) -> tuple[int, float]:
    predicted = _predict(config, replace(s, shared_prefix=shared_prefix_applies(config, s)))
    return predicted.peak_bytes, predicted.step_seconds


_MODELS: dict[tuple, Any] = {}
_TRACES: dict[tuple, Any] = {}
_CONFIGS: dict[int, Any] = {}  # the configs the keys name by id, held so that no other object takes their id


def _memo(store: dict, key: tuple, make: Any) -> Any:
    """One meta model / trace per distinct input within a search (``key[0]``: the config's id)."""
    if key not in store:
        if len(store) > 64:
            store.clear()
        store[key] = make()
    return store[key]


def _predict(config: Any, s: Settings) -> Plan:
    """The prediction for settings ``s`` as :func:`plan` resolved them (checkpointing mode lower-case, the tiled-MLP
    default chosen, ``shared_prefix``: whether the layout runs)."""
    from slimrl.compat.vllm_info import kv_bytes_per_token
    from slimrl.ops.chunked_logprob import auto_chunk_rows
    from slimrl.planning import trace

    dev = s.device
    if len(_CONFIGS) > 16 and id(config) not in _CONFIGS:
        for held in (_MODELS, _TRACES, _CONFIGS):
            held.clear()
    _CONFIGS[id(config)] = config
    named = find_gpu(s.gpu) if s.gpu else None
    dtype = named.dtype if named else torch.bfloat16 if dev == "cuda" else torch.float32
    shape = _shape(config)
    every = _checkpoint_every(s)
    tp = calibrate(dev, dtype, gpu=named)
    weight_bytes, params, lora = _memo(
        _MODELS,
        (id(config), "weights", dtype, s.lora_r, s.load_in_4bit),
        lambda: _weights(trace.meta_model(config, dtype, s.lora_r, 0), s.load_in_4bit, dtype),
    )
    prompt, completion = s.max_prompt_length, s.max_completion_length
    work: Workload = s.workload
    rows = s.per_device_train_batch_size * (2 if work.paired else 1)
    mini = min(s.unsloth_grpo_mini_batch or rows, rows)
    chunk = s.chunk_rows or auto_chunk_rows(rows * completion, shape["vocab"], torch.device("cpu"))
    phases = {
        "runtime": tp.runtime_bytes if dev == "cpu" else CUDA_CONTEXT_BYTES,
        "weights": weight_bytes,
        "adapter_and_optimizer": 16 * lora if s.lora_r else 2 * weight_bytes,
    }
    if not s.lora_r and work.keeps_reference(s.beta):
        phases["reference"] = reference_bytes(weight_bytes, dtype, load_in_4bit=s.load_in_4bit)
    kv_token = kv_bytes_per_token(config, dtype)

    def layered(name: str, run: Any) -> tuple[int, ...]:
        """``run(model)`` on models of 2n and 3n decoder layers (n: the checkpointing period), extrapolated to the
        full depth: past the first layer every figure is affine in the number of identical layers."""
        n = max(every, 1)
        key = (id(config), dtype, s.lora_r, every, s.tiled_mlp, s.fused_lora)
        small, double = (
            _memo(
                _TRACES,
                (*key, name, k),
                lambda k=k: run(
                    _memo(
                        _MODELS,
                        (*key, k),
                        lambda k=k: trace.meta_model(
                            _with_layers(config, k), dtype, s.lora_r, every, tiled=s.tiled_mlp, fused=s.fused_lora
                        ),
                    )
                ),
            )
            for k in (2 * n, 3 * n)
        )
        return tuple(int(a + (b - a) * (shape["layers"] - 2 * n) / n) for a, b in zip(small, double, strict=True))

    notes, host, offloaded = [], 0, 0  # host: host_pinned_bytes
    if work.generates:
        if s.fast_inference:
            wanted, total = kv_token * rows * (prompt + completion), cuda_total(s.gpu) if dev == "cuda" else None
            # a float gpu_memory_utilization: the engine takes that share of the card, its (shared) weights included
            share = int(total * s.gpu_memory_utilization) - weight_bytes if total else 0
            phases["generation"] = max(share, wanted) if total else wanted
            if dev == "cpu":
                phases["engine"] = _engine_on_cpu(config, s.lora_r, dtype, notes)
        else:
            kv = kv_token * rows * (prompt + completion)
            regrow = kv // shape["layers"]  # HF's cache grows by concatenation, one layer at a time
            decode = 3 * rows * shape["vocab"] * 4  # last-position logits, fp32, and sampling's copies
            (prefill,) = layered(f"prefill {rows} {prompt}", lambda m: (trace.trace_prefill(m, rows, prompt),))
            phases["generation"] = max(prefill, kv + regrow + decode)
    passes = no_grad_passes(s)
    shared, groups = s.shared_prefix, s.num_generations
    if passes:
        seqs, c = packed(mini, groups, completion, shared)
        _, peak = layered(
            f"no grad {seqs} {prompt} {c} {chunk}",
            lambda m: trace.trace_logprob_pass(
                m, seqs, prompt, c, grad=False, entropy=False, chunk_rows=chunk, device=dev
            ),
        )
        extra = prefix_gather_bytes(config, mini, prompt, completion, dtype) if shared else 0
        phases["logprobs_no_grad"] = peak + extra
    entropy = work.entropy
    seqs, c = packed(rows, groups, completion, shared)
    kept, peak = layered(
        f"grad {seqs} {prompt} {c} {chunk} {entropy}",
        lambda m: trace.trace_logprob_pass(
            m, seqs, prompt, c, grad=True, entropy=entropy, chunk_rows=chunk, device=dev
        ),
    )
    if dev == "cuda" and s.gradient_checkpointing == "slimrl":  # layer inputs in host memory, 2 on the GPU
        offloaded = max(shape["layers"] - 2, 0) * seqs * (prompt + c) * shape["hidden"] * dtype.itemsize
        kept, peak = kept - offloaded, peak - offloaded
        host = pinned_host_bytes(offloaded, shape["layers"] - 2, notes)
    phases["policy_forward"] = kept
    phases["backward"] = peak + (prefix_gather_bytes(config, rows, prompt, completion, dtype) if shared else 0)
    outside = phases["runtime"] if dev == "cuda" else 0  # the context: not in max_memory_allocated
    peak_bytes = sum(phases.get(k, 0) for k in PERSISTENT) + phases[largest_phase(phases)] - outside
    split = step_split(s, shape, params, weight_bytes, kv_token, rows, prompt, completion, passes, every, tp)
    if dev == "cuda":
        _cuda_passes(config, s, split, rows, every, named or current_gpu() or find_gpu(DEFAULT_GPU))
    if offloaded:
        split["offload_copies"] = offload_seconds(
            offloaded,
            min(host, pinnable_bytes()) if s.host_pinning else 0,
            (named or current_gpu() or find_gpu(DEFAULT_GPU)).host_link_gbs * 1e9,
            split["policy_forward"] + split["backward"],
        )
    return Plan(
        settings=_as_json(s),
        peak_bytes=peak_bytes,
        phases=phases,
        step_seconds=sum(split.values()),
        step_split=split,
        notes=notes,
        host_pinned_bytes=host,
    )


def _engine_on_cpu(config: Any, lora_r: int, dtype: torch.dtype, notes: list[str]) -> int:
    """The started engine's persistent bytes on CPU (:mod:`slimrl.planning.engine_cpu`)."""
    from slimrl.planning import engine_cpu

    runtime, how = _memo(
        _TRACES, (id(config), "engine", lora_r, dtype), lambda: engine_cpu.runtime_bytes(config, lora_r, dtype)
    )
    if runtime is None:
        notes.append(f"the engine's runtime is not included: {how}")
    return engine_cpu.computed_bytes(config, lora_r, dtype) + (runtime or 0)


def _with_layers(config: Any, layers: int) -> Any:
    import copy

    small = copy.deepcopy(config)
    text = getattr(small, "text_config", None) or small
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None):
        text.layer_types = list(text.layer_types)[:layers]
    return small


def _fastest_fitting(config: Any, s: Settings, budget: int) -> dict[str, Any] | None:
    """:func:`slimrl.planning.search.fastest_fitting` with this module's prediction."""
    return fastest_fitting(lambda st: _predict(config, st), s, budget)


def _longest_fitting(config: Any, s: Settings, budget: int, step: int = 64) -> int | None:
    """:func:`slimrl.planning.search.longest_fitting` with this module's prediction."""
    return longest_fitting(lambda st: _predict(config, st), config, s, budget, step)
