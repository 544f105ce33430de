"""slimrl's default for ``unsloth_tiled_mlp`` when the user gives none: tile the MLPs where the plan says it pays.

With checkpointing, the backward recomputes one decoder layer at a time over every token of the micro-batch, and a
gated MLP's intermediates (``[tokens, intermediate]`` several times over) are most of that recompute at long
lengths. Tiling (:mod:`slimrl.models.tiled_mlp`) computes the same numbers a tile of tokens at a time, for one more
MLP forward per layer in the backward. The rule: on CUDA, under activation checkpointing, tile when the predicted
peak with tiles is at least :data:`GAIN` below the peak without; on a CPU never (memory is rarely what stops a CPU
run, and the extra forward is felt there). ``unsloth_tiled_mlp=True`` or ``False`` given by the user is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from slimrl.planning.settings import Settings

GAIN = 0.10  # the share of the peak tiling must save to be worth one more MLP forward per layer


def tiled_default(settings: Settings, peak: Callable[[Settings], int]) -> tuple[bool, str | None]:
    """(tile?, a note saying why) for ``settings`` whose ``tiled_mlp`` is None (module docstring); ``peak``: the
    planner's predicted peak of a run's settings."""
    if settings.device != "cuda" or str(settings.gradient_checkpointing).lower() == "false":
        return False, None
    plain, tiled = peak(replace(settings, tiled_mlp=False)), peak(replace(settings, tiled_mlp=True))
    if tiled > (1 - GAIN) * plain:
        return False, None
    return True, (
        f"tiled MLP (slimrl's default on CUDA where it saves >= {GAIN:.0%}: peak {plain / 2**30:.2f} -> "
        f"{tiled / 2**30:.2f} GiB; unsloth_tiled_mlp=False turns it off)"
    )
