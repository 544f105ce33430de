"""Worst case first (``slimrl_longest_first=True``, ``slimrl train --longest_first true``; GRPO, RLOO).

A run's memory peak comes with its longest completions, which may first appear hundreds of steps in (Unsloth #1624
"OOM after ~120 steps"). With this option the first training generation is made to produce the longest
completions the run allows: end-of-sequence is suppressed until ``max_completion_length`` tokens (HF generate:
``min_new_tokens``; slimrl's engine and TRL's vLLM client: ``min_tokens``), so step 1 meets the peak. If it runs out
of memory (after :mod:`slimrl.patching.online.oom` split what it can), the error says so with the plan's numbers
(:mod:`slimrl.planning`) and the settings that would fit. Only that first generation batch is forced: its samples are
trained on as usual (the reward sees full-length completions once); every later step samples as TRL does.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from slimrl.compat.runtime.callsite import warn
from slimrl.patching.every_trainer.extra_fields import fields_of
from slimrl.patching.every_trainer.state import trainer_state


def wanted(trainer: Any) -> bool:
    """The first training generation of a run with ``slimrl_longest_first``."""
    return bool(
        fields_of(trainer.args).slimrl_longest_first
        and trainer.model.training
        and trainer.state.global_step == 0
        and not trainer_state(trainer).longest_done
    )


@contextmanager
def forced_length(trainer: Any) -> Iterator[None]:
    """Every generation backend of ``trainer`` produces exactly ``max_completion_length`` tokens (barring the
    length budget) for the duration."""
    length = trainer.args.max_completion_length
    restore = []
    config = getattr(trainer, "generation_config", None)  # HF generate
    if config is not None:
        restore.append((config, "min_new_tokens", getattr(config, "min_new_tokens", None)))
        config.min_new_tokens = length
    backend = getattr(trainer, "vllm_generation", None) if getattr(trainer, "use_vllm", False) else None
    kwargs = getattr(backend, "sampling", None)  # slimrl's engine
    if kwargs is None:
        kwargs = getattr(backend, "generation_kwargs", None)  # TRL's VLLMGeneration (colocate and server)
    if isinstance(kwargs, dict):
        restore.append((kwargs, "min_tokens", kwargs.get("min_tokens")))
        kwargs["min_tokens"] = length
    elif backend is not None:
        warn(
            f"slimrl_longest_first: {type(backend).__name__} takes no minimum length; step 1 samples as usual",
            UserWarning,
        )
    try:
        yield
    finally:
        for owner, name, old in restore:
            if isinstance(owner, dict):
                owner.pop(name, None) if old is None else owner.__setitem__(name, old)
            else:
                setattr(owner, name, old)


def generate_longest_first_factory(orig):
    """``_generate_and_score_completions`` with the first training generation forced to full length."""

    @functools.wraps(orig)
    def slimrl_generate_longest_first(self, *args, **kwargs):
        if not wanted(self):
            return orig(self, *args, **kwargs)
        trainer_state(self).longest_done = True
        with forced_length(self):
            return orig(self, *args, **kwargs)

    return slimrl_generate_longest_first


def failure_message(trainer: Any, error: BaseException) -> str:
    """Why step 1 failed, with the plan's prediction for this run and what would fit the device."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = (
        f"slimrl_longest_first: step 1, with completions of {trainer.args.max_completion_length} tokens (the "
        f"longest this run allows), ran out of memory ({first})"
    )
    try:
        from slimrl.compat.memory import total_bytes
        from slimrl.patching.online.autofit import settings_of
        from slimrl.planning.plan import plan
        from slimrl.planning.search import largest_phase

        model = trainer.accelerator.unwrap_model(trainer.model)
        state = trainer_state(trainer)
        settings = settings_of(model, trainer.args, None, state.algorithm, state.workload)
        result = plan(model.config, settings, budget=total_bytes(trainer.accelerator.device))
    except Exception as err:  # noqa: BLE001 - the plan is extra information; the failure is the message
        return f"{text}; no plan ({type(err).__name__}: {err})"
    phase = largest_phase(result.phases)
    fix = (
        f"fits with {result.recommended}"
        if result.recommended
        else f"max_completion_length <= {result.max_completion_length_that_fits} fits"
        if result.max_completion_length_that_fits
        else "a smaller batch or a 4-bit base"
    )
    return (
        f"{text}. slimrl plan predicts a peak of {result.peak_bytes / 2**30:.2f} GiB (largest phase {phase}: "
        f"{result.phases[phase] / 2**30:.2f} GiB) on a device of {result.budget_bytes / 2**30:.2f} GiB; {fix}; "
        f"see `slimrl plan --budget`"
    )
