"""slimrl's lean default at a GRPO/RLOO trainer's ``__init__`` on CUDA: the settings that buy memory with time, each
applied only while the plan of this run says the card needs it (:mod:`slimrl.planning.levers`).

The levers are the tiled MLP (``unsloth_tiled_mlp``) and the offload of checkpointed layer inputs to host memory
(``use_gradient_checkpointing="slimrl"``, get_peft_model's default). Each that the user left to slimrl starts off;
then, while the predicted peak is above the budget's "fits" share, the one with the fewest predicted seconds per
GiB saved is applied; one predicted to cost no time (the offload where its copies hide behind the compute) is
applied whatever the budget (:mod:`slimrl.planning.levers`). The budget is ``slimrl_memory_budget``, else
what :func:`slimrl.patching.online.autofit.default_budget` finds: the memory free now plus what this process
holds, so a colocated engine's share is not counted. Whether host memory pins here
(:func:`slimrl.compat.page_lock.probe`) prices the offload: where it does not, the copies are synchronous, the
offload is used only where needed, and one line says so.

Each lever applied, or the offload taken off, is listed in the changed-defaults table printed when the trainer
starts, with the predicted peak and step seconds with and without. The math is TRL's either way (tiles and offload
compute the same numbers). The user's word is kept: ``unsloth_tiled_mlp`` given to ``from_pretrained``, a model
tiled by hand, a ``use_gradient_checkpointing`` given to either (an offload the user chose where memory does not pin
gets the line too). A run the planner cannot plan keeps its MLPs whole and its checkpointing as it was.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from slimrl.compat.model_state import model_state
from slimrl.patching.every_trainer.state import config_state
from slimrl.planning.settings import Settings, Workload


def asked(model: Any) -> bool | int | None:
    """``unsloth_tiled_mlp`` as given to ``from_pretrained`` (None: not given, or a model slimrl did not load)."""
    return model_state(model).tiled_mlp


def apply_lean_default(bound: dict[str, Any], algorithm: str, workload: Workload) -> None:
    """The trainer-``__init__`` hook (module docstring); ``bound``: the constructor's arguments by name."""
    from slimrl.models.checkpointing import OFFLOAD_MODES, is_on
    from slimrl.models.tiled_mlp import is_tiled
    from slimrl.patching.online.autofit import prompt_length, settings_of

    args, model = bound.get("args"), bound.get("model")
    if args is None or model is None or isinstance(model, str):
        return
    prompt = prompt_length(bound.get("train_dataset"), bound.get("processing_class"))
    settings = settings_of(model, args, prompt, algorithm, workload)
    if settings.device != "cuda":
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    checkpointing = bool(getattr(args, "gradient_checkpointing", False) or is_on(base))
    state = model_state(model)
    offloads = checkpointing and _offloader(base) is not None and state.checkpointing in OFFLOAD_MODES
    lock = _page_lock(model) if offloads else None
    levers = ("tiled_mlp",) if checkpointing and asked(model) is None and not is_tiled(model) else ()
    levers += ("offload",) if offloads and state.checkpointing_chosen else ()
    mode = "slimrl" if offloads and "offload" not in levers else "true"  # an offload lever starts off
    settings = replace(
        settings,
        tiled_mlp=False if "tiled_mlp" in levers else settings.tiled_mlp,
        gradient_checkpointing=mode if checkpointing else "false",
        host_pinning=lock is None or lock.overlaps,
    )
    chosen = _choose(model, args, settings, levers)
    applied, left = chosen if chosen is not None else ([], [])
    changed = config_state(args).changed
    for p in applied:
        if p.lever == "tiled_mlp":
            from slimrl.models.tiled_mlp import tile_mlp

            if tile_mlp(model):
                where = "at no predicted cost" if p.free else "where needed"
                changed["unsloth_tiled_mlp"] = (False, f"True (slimrl's default {where}; {p.note()})")
    off = [p for p in left if p.lever == "offload"]
    if off:
        _keep_layer_inputs_on_gpu(base)
        state.checkpointing = True
        changed["use_gradient_checkpointing"] = (
            "slimrl",
            f"True, layer inputs kept on the GPU (the run fits without the offload; {off[0].note()})",
        )
    elif lock is not None and not lock.overlaps:
        from slimrl.compat.runtime.callsite import warn

        why = "it is needed to fit" if state.checkpointing_chosen else "use_gradient_checkpointing asked for it"
        warn(f"{lock.line()}; the offload is kept: {why} (use_gradient_checkpointing=True keeps them on the GPU)")


def _choose(model: Any, args: Any, settings: Settings, levers: tuple[str, ...]) -> tuple[list, list] | None:
    """(levers applied, levers left off) for this run, or None where the planner cannot plan it (one line)."""
    from slimrl.compat.memory import parse_bytes
    from slimrl.compat.runtime.callsite import warn
    from slimrl.patching.every_trainer.extra_fields import fields_of
    from slimrl.patching.online.autofit import default_budget
    from slimrl.planning.levers import choose
    from slimrl.planning.plan import plan
    from slimrl.planning.verdict import fitting_bytes

    if not levers:
        return [], []
    budget_text = fields_of(args).slimrl_memory_budget
    budget = parse_bytes(budget_text) if budget_text else default_budget("cuda")

    def predict(s: Settings) -> tuple[int, float]:
        result = plan(model.config, s, search=False)
        return result.peak_bytes, result.step_seconds

    try:
        _, applied, left = choose(settings, levers, fitting_bytes(budget, "cuda"), predict)
    except Exception as err:  # noqa: BLE001 - a model the planner cannot trace: TRL's MLPs, the checkpointing as set
        warn(
            f"slimrl's lean default: this model could not be planned ({type(err).__name__}: {err}); its MLPs run "
            f"whole (unsloth_tiled_mlp=True tiles them) and its checkpointing is as set"
        )
        return None
    return applied, left


def _offloader(base: Any) -> Any:
    """The offloader slimrl's checkpointing policy installed on ``base`` (None: no offload)."""
    policy = base.__dict__.get("_set_gradient_checkpointing")
    return getattr(policy, "slimrl_offloader", None)


def _page_lock(model: Any) -> Any:
    from slimrl.compat.page_lock import probe

    device = next((p.device for p in model.parameters() if p.device.type == "cuda"), torch.device("cuda"))
    return probe(device)


def _keep_layer_inputs_on_gpu(base: Any) -> None:
    """Plain checkpointing of every layer: slimrl's offload policy removed, checkpointing re-enabled through
    transformers (the Trainer enables it again from its config at ``train()``)."""
    from slimrl.models.checkpointing import is_on, turn_on, uninstall_policy

    uninstall_policy(base)
    if is_on(base):
        turn_on(base)
