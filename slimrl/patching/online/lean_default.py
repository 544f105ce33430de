"""slimrl's default for ``unsloth_tiled_mlp`` at a GRPO/RLOO trainer's ``__init__``: where the user gave none, tile
the model's MLPs when the plan of this run says it pays (:func:`slimrl.planning.tiling.tiled_default`: on CUDA, under
activation checkpointing, at least 10 % off the predicted peak).

The tiled MLP computes the same numbers (:mod:`slimrl.models.tiled_mlp`: position-wise, the weight gradients summed
tile by tile), so the run's math is TRL's; the change is listed in the changed-defaults table printed when the trainer
starts. ``unsloth_tiled_mlp=True``, an int or ``False`` given to ``from_pretrained`` is the user's word and is kept,
as is a model tiled by hand. A run the planner cannot plan (an architecture it cannot trace) keeps its MLPs whole.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from slimrl.compat.model_state import model_state
from slimrl.patching.every_trainer.state import config_state
from slimrl.planning.settings import Workload


def asked(model: Any) -> bool | int | None:
    """``unsloth_tiled_mlp`` as given to ``from_pretrained`` (None: not given, or a model slimrl did not load)."""
    return model_state(model).tiled_mlp


def apply_lean_default(bound: dict[str, Any], algorithm: str, workload: Workload) -> None:
    """The trainer-``__init__`` hook (module docstring); ``bound``: the constructor's arguments by name."""
    from slimrl.models.tiled_mlp import is_tiled, tile_mlp
    from slimrl.patching.online.autofit import prompt_length, settings_of

    args, model = bound.get("args"), bound.get("model")
    if args is None or model is None or isinstance(model, str) or asked(model) is not None or is_tiled(model):
        return
    prompt = prompt_length(bound.get("train_dataset"), bound.get("processing_class"))
    settings = settings_of(model, args, prompt, algorithm, workload)
    if settings.device != "cuda":
        return
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    checkpointing = bool(
        getattr(args, "gradient_checkpointing", False) or getattr(base, "is_gradient_checkpointing", False)
    )
    settings = replace(settings, tiled_mlp=None, gradient_checkpointing="slimrl" if checkpointing else "false")
    tiled, why = _decide(model, settings)
    if tiled and tile_mlp(model):
        config_state(args).changed["unsloth_tiled_mlp"] = (False, f"True ({why})")


def _decide(model: Any, settings: Any) -> tuple[bool, str | None]:
    from slimrl.compat.runtime.callsite import warn
    from slimrl.planning.plan import plan
    from slimrl.planning.tiling import tiled_default

    try:
        return tiled_default(settings, lambda s: plan(model.config, s, search=False).peak_bytes)
    except Exception as err:  # noqa: BLE001 - a model the planner cannot trace: TRL's MLPs, untouched
        warn(
            f"slimrl's tiled-MLP default: this model could not be planned ({type(err).__name__}: {err}); its MLPs "
            f"run whole (unsloth_tiled_mlp=True tiles them)"
        )
        return False, None
