"""``slimrl plan --compare``: slimrl's prediction beside TRL alone's and TRL + Liger's for the same settings, before
any weight loads.

slimrl's side is :func:`slimrl.planning.plan.plan`. TRL's sides are :func:`slimrl.planning.baseline.simulate` with
the head of the installed TRL release (and, where ``liger_kernel`` is installed, Liger's), at the same rows and
tokens: a generation batch's rows of prompt + completion tokens (DPO: that many pairs). Generation is taken to cost
TRL what it costs slimrl's HF-generate path (the same KV cache; slimrl's shared prefill only lowers its prefill), so
the sides differ in the passes that score and train. For each side: its peak, its phases, and with a budget the
longest completion that fits (multiples of ``step`` tokens; on CUDA, whose verdict is "fits":
:mod:`slimrl.planning.verdict`), and on CUDA its training pass's predicted seconds (``train_seconds``, by phase in
``train_split``: :func:`train_times`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from slimrl.compat.liger import liger_installed
from slimrl.planning.baseline import family_of, simulate
from slimrl.planning.search import MAX_SEARCH_TOKENS, context_room
from slimrl.planning.settings import Settings
from slimrl.planning.verdict import fitting_bytes


def _trl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return "1.16.0"


def trl_side(config: Any, s: Settings, family: str, generation: int = 0, runtime: int = 0) -> dict[str, Any]:
    """TRL alone (or with Liger) for settings ``s``: ``{"peak_bytes", "phases"}``; ``generation`` and ``runtime``
    (the CPU process's own size) as slimrl's plan has them."""
    rows = s.per_device_train_batch_size
    step = simulate(
        config,
        s.workload,
        s.max_prompt_length + s.max_completion_length,
        family,
        rows=rows,
        lora_r=s.lora_r,
        checkpointing=s.gradient_checkpointing != "false",
        reference=s.workload.keeps_reference(s.beta),
        device=s.device,
        load_in_4bit=s.load_in_4bit,
    )
    phases = {"runtime": runtime, **step.persistent, "step": step.pass_peak}
    if s.workload.generates:
        phases["generation"] = generation
    peak = runtime + sum(step.persistent.values()) + max(step.pass_peak, generation)
    return {"peak_bytes": peak, "phases": phases}


def train_times(config: Any, s: Settings, ours: Any) -> dict[str, dict[str, float]]:
    """Each side's training pass on the plan's GPU (:mod:`slimrl.planning.cuda_pass`: the policy's log-prob pass
    with gradients, the loss and the backward; what the lease timed): TRL's checkpointing of every layer, slimrl's
    as resolved (its layout, tiles and offload copies included)."""
    from slimrl.compat.gpus import current_gpu, find_gpu
    from slimrl.planning.cuda_pass import TRL, TRL_LIGER, recompute_share, run_shape, slimrl_kernels, train_seconds
    from slimrl.planning.timing import DEFAULT_GPU

    gpu = find_gpu(s.gpu) if s.gpu else current_gpu() or find_gpu(DEFAULT_GPU)
    shape = run_shape(s)
    trl_recompute = 0.0 if s.gradient_checkpointing == "false" else 1.0
    ours_mode, every = ours.settings["gradient_checkpointing"], ours.settings.get("checkpoint_every_n_layers")
    recompute = recompute_share(ours_mode, every)
    slim = train_seconds(
        config,
        gpu,
        **shape,
        recompute=recompute,
        kernels=slimrl_kernels(bool(ours.settings["fused_lora"] and s.lora_r)),
        shared_prefix=bool(ours.settings["shared_prefix"]),
        tiled=bool(ours.settings["tiled_mlp"]),
    )
    if ours.step_split.get("offload_copies"):
        slim["offload_copies"] = ours.step_split["offload_copies"]
    return {
        "trl": train_seconds(config, gpu, **shape, recompute=trl_recompute, kernels=TRL),
        "trl + liger": train_seconds(config, gpu, **shape, recompute=trl_recompute, kernels=TRL_LIGER),
        "slimrl": slim,
    }


def compare(config: Any, s: Settings, budget: int | None = None, step: int = 64) -> dict[str, dict[str, Any]]:
    """The sides for ``s`` (module docstring); ``budget`` (bytes) adds each side's longest completion that fits."""
    from slimrl.planning.plan import plan

    if s.workload.trl is None:
        raise ValueError(
            f"--compare: TRL alone is not simulated for {s.algorithm!r} (its workload declares no TRL step)"
        )
    ours = plan(config, s, search=False)
    generation = ours.phases.get("generation", 0)
    runtime = ours.phases.get("runtime", 0) if s.device == "cpu" else 0  # CUDA: peaks of allocated bytes, no context
    families = {"trl": family_of(_trl_version())}
    if liger_installed():
        families["trl + liger"] = "liger"
    sides = {"slimrl": {"peak_bytes": ours.peak_bytes, "phases": dict(ours.phases)}}
    for name, family in families.items():
        sides[name] = trl_side(config, s, family, generation, runtime)
    if s.device == "cuda":
        for name, seconds in train_times(config, s, ours).items():
            if name in sides:
                sides[name]["train_seconds"] = round(sum(seconds.values()), 6)
                sides[name]["train_split"] = {k: round(v, 6) for k, v in seconds.items()}
    if budget is not None:
        budget = fitting_bytes(budget, s.device)  # the longest completion whose verdict is "fits"
        room = context_room(config, s.max_prompt_length)
        top = MAX_SEARCH_TOKENS if room is None else min(room, MAX_SEARCH_TOKENS)
        sides["slimrl"]["longest_completion"] = _longest(
            lambda c: plan(config, replace(s, max_completion_length=c), search=False).peak_bytes, budget, step, top
        )
        tokens = s.max_prompt_length + s.max_completion_length
        for name, family in families.items():
            sides[name]["longest_completion"] = _longest(
                lambda c, family=family: trl_side(
                    config,
                    replace(s, max_completion_length=c),
                    family,
                    generation * (s.max_prompt_length + c) // tokens,
                    runtime,
                )["peak_bytes"],
                budget,
                step,
                top,
            )
    return sides


def _longest(peak_at, budget: int, step: int, top: int) -> int | None:
    """Largest multiple of ``step`` up to ``top`` tokens whose ``peak_at`` fits ``budget`` (None: not even
    ``step``)."""
    if step > top or peak_at(step) > budget:
        return None
    if peak_at(top // step * step) <= budget:
        return top // step * step
    lo, hi = 1, 2
    while hi * step <= top and peak_at(hi * step) <= budget:
        lo, hi = hi, hi * 2
    hi = min(hi, top // step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak_at(mid * step) <= budget else (lo, mid)
    return lo * step
