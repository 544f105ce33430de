"""Auto-fit: before a GRPO/RLOO trainer is built, apply the fastest plan that fits the memory budget.

With ``slimrl_auto_fit=True`` on the config (``slimrl train --auto_fit true``), the trainer's ``__init__`` asks
:func:`slimrl.planning.plan` for the run as configured -- the model's own config, the LoRA rank, 4-bit or not, the
engine or HF generate, the batch, completion length, ``beta``, and the prompt length measured on the first rows of
the training set -- and applies its ``recommended`` settings, the fastest that fit, fewest recomputes first:

* activation checkpointing: off, every 2nd decoder layer (``selective``) or every layer (slimrl's mode: offloaded
  on CUDA);
* ``unsloth_grpo_mini_batch``: the rows of a no-grad log-prob forward, halved only while that pass is the peak.

What it changed is listed in the changed-defaults table printed when the trainer starts. The budget is
``slimrl_memory_budget`` (``"12GB"``), else the memory free now plus what this process already holds (its weights
are in the plan): on CUDA the settings chosen are those whose verdict is "fits" (:mod:`slimrl.planning.verdict`, the
same rule as ``slimrl plan --budget``), on CPU a margin of 10 % of the machine's memory is kept free. A run that
fits with no setting raises a ``ValueError`` before training, saying by how much it is over and which completion
length would fit.

Left to their automatic values: ``unsloth_num_chunks`` (already sized from free memory at each pass) and the
engine's KV share (sized when the engine was built, ``gpu_memory_utilization``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from slimrl.patching.every_trainer.extra_fields import fields_of
from slimrl.patching.every_trainer.state import config_state
from slimrl.planning.settings import Settings, Workload

MARGIN = 0.10  # of the machine's total memory kept free on CPU (on CUDA: slimrl.planning.verdict's margin)


def default_budget(device: str) -> int:
    """Bytes the run may use: on CUDA the card as the plan's verdict takes it (free memory now + what this process
    holds already + the CUDA context; the verdict keeps the allocator's margin); on CPU free memory now + what this
    process holds, minus :data:`MARGIN`."""
    if device == "cuda":
        from slimrl.compat.gpus import CUDA_CONTEXT_BYTES

        free, _total = torch.cuda.mem_get_info()
        return int(free + torch.cuda.memory_allocated() + CUDA_CONTEXT_BYTES)
    import psutil

    mem = psutil.virtual_memory()
    return int(mem.available + psutil.Process().memory_info().rss - MARGIN * mem.total)


def prompt_length(dataset: Any, processing_class: Any, rows: int = 256) -> int | None:
    """Longest prompt in tokens among the first ``rows`` rows of a ``prompt`` dataset (chat template applied to
    conversations, as TRL does); None when it cannot be measured."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if dataset is None or tokenizer is None or "prompt" not in getattr(dataset, "column_names", ()):
        return None
    longest = 0
    for prompt in dataset.select(range(min(rows, len(dataset))))["prompt"]:
        try:
            if isinstance(prompt, list):
                ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
                ids = ids["input_ids"] if isinstance(ids, dict) else ids
            else:
                ids = tokenizer(prompt)["input_ids"]
        except Exception:  # noqa: BLE001 - a template or tokenizer that cannot serve this row: no measurement
            return None
        longest = max(longest, len(ids))
    return longest or None


def settings_of(model: Any, args: Any, prompt: int | None, algorithm: str, workload: Workload) -> Settings:
    """The plan's settings for this model and config (``workload``: what the trainer's step does)."""
    from slimrl.compat.model_state import lora_rank
    from slimrl.generation.trl_backend import engine_of
    from slimrl.models.fused_lora import is_fused
    from slimrl.models.tiled_mlp import is_tiled
    from slimrl.patching.every_trainer.validation import model_max_seq_length

    lora_r = lora_rank(model)
    completion = args.max_completion_length
    limit = getattr(args, "max_seq_length", None) or model_max_seq_length(model)
    if prompt is None:
        prompt = max(1, limit - completion) if limit else 512
    cuda = torch.cuda.is_available() and not getattr(args, "use_cpu", False)
    return Settings(
        algorithm=algorithm,
        workload=workload,
        per_device_train_batch_size=args.per_device_train_batch_size,
        num_generations=args.num_generations,
        max_prompt_length=prompt,
        max_completion_length=completion,
        lora_r=lora_r,
        load_in_4bit=bool(getattr(model, "is_loaded_in_4bit", False)),
        fast_inference=engine_of(model) is not None,
        device="cuda" if cuda else "cpu",
        beta=float(getattr(args, "beta", 0.0) or 0.0),
        shared_prefix=fields_of(args).slimrl_shared_prefix,
        tiled_mlp=is_tiled(model),
        fused_lora=is_fused(model),
    )


def apply_auto_fit(bound: dict[str, Any], algorithm: str, workload: Workload) -> None:
    """The trainer-``__init__`` hook (GRPO, RLOO): with ``slimrl_auto_fit``, plan and apply (module docstring)."""
    args, model = bound.get("args"), bound.get("model")
    if args is None or not fields_of(args).slimrl_auto_fit or isinstance(model, str) or model is None:
        return
    from slimrl.compat.memory import parse_bytes
    from slimrl.errors import InputError
    from slimrl.planning.plan import plan

    settings = settings_of(
        model, args, prompt_length(bound.get("train_dataset"), bound.get("processing_class")), algorithm, workload
    )
    budget_text = fields_of(args).slimrl_memory_budget
    budget = parse_bytes(budget_text) if budget_text else default_budget(settings.device)
    try:
        result = plan(model.config, settings, budget=budget)
    except InputError as err:  # the budget is below the weights: name the config's field
        raise ValueError(
            f"slimrl_memory_budget={budget_text or f'{budget / 2**30:.2f}GB (free memory)'}: "
            f"{str(err).split(': ', 1)[-1]}"
        ) from None
    choice = result.recommended
    if choice is None:
        raise ValueError(
            f"slimrl_auto_fit: nothing fits the {budget / 2**30:.2f} GiB memory budget "
            f"({'slimrl_memory_budget' if budget_text else 'free memory'}): "
            f"{'; '.join(result.notes)}"
        )
    mode, every = choice["gradient_checkpointing"], choice.get("checkpoint_every_n_layers")
    chosen = plan(
        model.config,
        replace(
            settings,
            gradient_checkpointing=mode,
            checkpoint_every_n_layers=every,
            unsloth_grpo_mini_batch=choice.get("unsloth_grpo_mini_batch"),
        ),
    )
    _apply(model, args, choice, f"auto_fit: plan {_gib(chosen.peak_bytes)} of {_gib(budget)}")
    config_state(args).auto_fit_plan = chosen


def _apply(model: Any, args: Any, choice: dict[str, Any], why: str) -> None:
    from slimrl.models.checkpointing import enable_checkpointing, turn_off, wants_offload

    mode = choice["gradient_checkpointing"]
    every = choice.get("checkpoint_every_n_layers") or 1
    changed = config_state(args).changed
    label = {
        "false": "False",
        "selective": f"True, every {every} layers",
        "slimrl": "True, every layer" + (" offloaded" if wants_offload("slimrl") else ""),
    }[mode]
    old = bool(getattr(args, "gradient_checkpointing", False))
    for name in ("gradient_checkpointing", "activation_checkpointing"):
        if hasattr(args, name):
            setattr(args, name, mode != "false")
    if mode == "false":
        turn_off(model)
    else:
        enable_checkpointing(model, "selective" if every > 1 else "slimrl", every_n_layers=every)
    changed["gradient_checkpointing"] = (old, f"{label} ({why})")
    mini = choice.get("unsloth_grpo_mini_batch")
    if mini is not None and mini != fields_of(args).unsloth_grpo_mini_batch:
        changed["unsloth_grpo_mini_batch"] = (args.unsloth_grpo_mini_batch, f"{mini} ({why})")
        args.unsloth_grpo_mini_batch = mini


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
