"""What slimrl remembers about the objects it patches: one typed record per trainer (:class:`TrainerState`) and one
per config (:class:`ConfigState`), each kept in a single attribute of the object and reached only through
:func:`trainer_state` / :func:`config_state`.

The records live on the objects (not in a table keyed by them) so they die with the trainer or config, travel with
``copy.deepcopy``, and need no clean-up; they are not dataclass fields of TRL's configs, so ``to_dict()``, the
saved ``training_args`` and argument parsers never see them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_ATTRIBUTE = "slimrl_state"


@dataclass
class TrainerState:
    """Per patched trainer: counters the metrics and ``slimrl verify`` read, and what the online-trainer features
    carry from one call to the next."""

    trained_tokens: int = 0  # completion tokens slimrl's log-prob path projected with gradient (this step)
    served_calls: int = 0  # forwards and kernel calls slimrl's log-prob routes served (all steps)
    shared_prefix_forwards: int = 0  # of those, forwards over shared-prefix packed rows (all steps)
    shared_prefills: int = 0  # HF generate calls whose repeated prompts were prefilled once (all steps)
    grad_rows: int | None = None  # rows per policy-backward slice, once an out-of-memory split it
    no_grad_rows: int | None = None  # rows per no-grad log-prob forward, once an out-of-memory split it
    oom_splits: int = 0  # out-of-memory splits so far (metric memory/oom_splits)
    longest_done: bool = False  # slimrl_longest_first: the full-length first generation was made
    is_window: Any = None  # GRPO old-log-prob reuse: the generation batch's micro-batch window
    is_inputs: Any = None  # GRPO old-log-prob reuse: the micro-batch whose policy forward fills the IS ratio
    seen_step: int | None = None  # fp16: the optimizer step seen at the last training_step
    skipped_steps: int = 0  # fp16: optimizer steps the gradient scaler skipped (metric fp16/skipped_steps)
    seen_scale: float | None = None  # fp16: the loss scale at the start of the last optimizer step seen
    fp16_warned: bool = False  # fp16 weights without a scaler: the overflow warning was given
    building: bool = False  # slimrl's constructor wrapper is running (a patched base's wrapper then stands aside)
    constructed: bool = False  # slimrl's constructor wrapper built this trainer (else it was built before the patch)
    built_before_said: bool = False  # the "built before PatchFastRL" line was given
    algorithm: str = ""  # PatchFastRL's name of the trainer
    workload: Any = None  # what one step does, for the planner (slimrl.planning.Workload; None: not planned)


@dataclass
class ConfigState:
    """Per patched TRL config: which values the user wrote, which ones slimrl changed and why."""

    explicit: frozenset[str] = frozenset()  # keywords the user passed (slimrl's changes excluded)
    changed: dict[str, tuple[Any, str]] = field(default_factory=dict)  # name -> (TRL's value, slimrl's, as text)
    defaults_printed: bool = False  # the changed-settings table was printed
    auto_fit_plan: Any = None  # the Plan slimrl_auto_fit applied
    push_skipped: str | None = None  # why push_to_hub was turned off at trainer creation (the Hub out of reach)


def _state(obj: Any, kind: type) -> Any:
    state = obj.__dict__.get(_ATTRIBUTE)
    if not isinstance(state, kind):
        state = kind()
        object.__setattr__(obj, _ATTRIBUTE, state)
    return state


def trainer_state(trainer: Any) -> TrainerState:
    """The trainer's record (created empty on first use)."""
    return _state(trainer, TrainerState)


def config_state(config: Any) -> ConfigState:
    """The config's record (created empty on first use)."""
    return _state(config, ConfigState)
