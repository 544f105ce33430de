"""The planner's searches over its own predictions (``predict(settings) -> Plan``, passed in): the fastest settings
that fit a memory budget, and the longest completion that does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from slimrl.planning.settings import Settings

# held for the whole run; the rest are phases
MAX_SEARCH_TOKENS = 1 << 20  # a config that states no context: no model reads more tokens than this
PERSISTENT = ("runtime", "weights", "adapter_and_optimizer", "reference", "engine")


def largest_phase(phases: dict[str, int]) -> str:
    return max((k for k in phases if k not in PERSISTENT), key=phases.get)


def fastest_fitting(predict: Callable[[Settings], Any], s: Settings, budget: int) -> dict[str, Any] | None:
    """The fastest of: no checkpointing, every 2nd layer checkpointed, every layer (fewest recomputes first); in each,
    TRL's no-grad batch first, and halved ``unsloth_grpo_mini_batch`` only while the no-grad pass is the peak."""
    rows = s.per_device_train_batch_size
    for mode, every in (("false", None), ("selective", 2), ("slimrl", None)):
        mini = None
        while True:
            p = predict(
                replace(s, gradient_checkpointing=mode, checkpoint_every_n_layers=every, unsloth_grpo_mini_batch=mini)
            )
            if p.peak_bytes <= budget:
                out = {"gradient_checkpointing": mode, "unsloth_grpo_mini_batch": mini}
                return {**out, "checkpoint_every_n_layers": every} if every else out
            if largest_phase(p.phases) != "logprobs_no_grad" or (mini or rows) == 1:
                break
            mini = max(1, (mini or rows) // 2)
    return None


def context_room(config: Any, prompt: int) -> int | None:
    """Completion tokens the model's own context leaves after ``prompt`` (``max_position_embeddings``; None: the
    config states no limit)."""
    text = getattr(config, "text_config", None) or config
    positions = getattr(text, "max_position_embeddings", None)
    return max(0, positions - prompt) if isinstance(positions, int) and positions > 0 else None


def longest_fitting(
    predict: Callable[[Settings], Any], config: Any, s: Settings, budget: int, step: int = 64
) -> int | None:
    """Largest ``max_completion_length`` (multiple of ``step``) whose prediction fits, at most the model's
    ``max_position_embeddings`` minus the prompt (:data:`MAX_SEARCH_TOKENS` where the config states none). Memory
    is close to affine in the length at fixed rows: two predictions give a first guess, which is then bracketed and
    bisected exactly."""
    peaks: dict[int, int] = {}

    def peak(k: int) -> int:  # k steps of completion
        if k not in peaks:
            peaks[k] = predict(replace(s, max_completion_length=k * step)).peak_bytes
        return peaks[k]

    def fits(k: int) -> bool:
        return peak(k) <= budget

    room = context_room(config, s.max_prompt_length)
    top = min(MAX_SEARCH_TOKENS if room is None else room, MAX_SEARCH_TOKENS) // step
    if top == 0 or not fits(1):
        return None
    if fits(top):
        return top * step
    guess = min(top, max(1, int(1 + (budget - peak(1)) / max((peak(16) - peak(1)) / 15, 1.0))))
    width = 1
    if fits(guess):  # bracket: lo fits, hi does not
        lo = guess
        while fits(lo + width):
            lo, width = lo + width, width * 2
        hi = lo + width
    else:
        hi = guess
        while not fits(max(1, hi - width)):  # 1 fits, so this ends
            hi, width = max(1, hi - width), width * 2
        lo = max(1, hi - width)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * step
