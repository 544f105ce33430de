"""The run-health monitor: a ``TrainerCallback`` that every patched GRPO/RLOO trainer gets (``slimrl_health``).

At each training log it appends the row TRL logged (already averaged over the logging interval) to its history,
runs :data:`slimrl.health.checks.CHECKS`, and

* adds one metric per check it can judge, ``health/<check>`` = 1.0 while the condition holds and 0.0 while it does
  not, to the same log row: it is put in front of the other callbacks, so W&B, TensorBoard, the printed logs and
  ``trainer.state.log_history`` all carry it;
* warns once per check (a :class:`RunHealthWarning` at the user's line, on the main process only), the first time
  its condition holds, with the message naming the cause and the usual fix.

It computes nothing in the step: it only reads what TRL logs. :meth:`HealthCallback.report` says, per check,
``ok``, ``warned at step N`` or why it was not judged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from slimrl.compat.runtime.callsite import warn
from slimrl.health.checks import CHECKS, Row, Thresholds, finite, reward_keys


class RunHealthWarning(UserWarning):
    """A run-health check found a training run that is not learning as it should (see :mod:`slimrl.health`)."""


def _is_training_row(logs: dict) -> bool:
    """A training step's log (TRL's per-step metrics), not an evaluation's or the final summary's."""
    return "loss" in logs and not any(k.startswith("eval_") for k in logs) and "train_runtime" not in logs


class HealthCallback(TrainerCallback):
    """The monitor (module docstring). ``thresholds``: None reads them from the trainer's config at each log, with
    ``read(args)`` (the patched trainers': their typed config fields) or the defaults."""

    def __init__(self, thresholds: Thresholds | None = None, read: Callable[[Any], Thresholds] | None = None) -> None:
        self.thresholds = thresholds
        self.read = read or (lambda args: Thresholds.from_args(args, {}))
        self.history: list[Row] = []
        self.warned: dict[str, int] = {}  # check -> step of its warning
        self.judged: set[str] = set()  # checks that could be judged at least once

    def on_train_begin(self, args, state, control, **kwargs):
        self.history = [dict(r) for r in state.log_history if _is_training_row(r)]  # a resumed run's rows

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not _is_training_row(logs):
            return
        row = {**logs, "step": state.global_step}
        self.history.append(row)
        health = self.evaluate(
            self.read(args) if self.thresholds is None else self.thresholds,
            state.global_step,
            warn_now=state.is_world_process_zero,
        )
        logs.update(health)
        row.update(health)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(health)  # Trainer.log stored its copy before calling the callbacks

    def evaluate(self, thresholds: Thresholds, step: int, warn_now: bool = True) -> dict[str, float]:
        """Run every check on the history; the ``health/<check>`` metrics; warn for checks newly holding."""
        metrics = {}
        for name, check in CHECKS.items():
            verdict = check(self.history, thresholds)
            if verdict is None:
                continue
            holds, message = verdict
            self.judged.add(name)
            metrics[f"health/{name}"] = 1.0 if holds else 0.0
            if holds and name not in self.warned:
                self.warned[name] = step
                if warn_now:
                    warn(
                        f"slimrl health (step {step}): {message} [slimrl_health=False turns these checks off]",
                        RunHealthWarning,
                    )
        return metrics

    def report(self) -> dict[str, str]:
        """Per check: ``ok``, ``warned at step N``, or ``not judged (...)``."""
        out = {}
        for name in CHECKS:
            if name in self.warned:
                out[name] = f"warned at step {self.warned[name]}"
            elif name in self.judged:
                out[name] = "ok"
            else:
                out[name] = "not judged (" + _why_not(name, self.history) + ")"
        return out


def _why_not(name: str, history: list[Row]) -> str:
    key = {
        "no_signal": "frac_reward_zero_std",
        "truncated": "completions/clipped_ratio",
        "entropy": "entropy",
        "kl": "kl",
        "clip": "clip_ratio/region_mean",
        "sampler_mismatch": "sampling/kl_k3/mean",
    }.get(name)
    if name == "sampler_mismatch" and not any(finite(r.get(key)) for r in history):
        return f"{key} not logged: no separate generator"
    if key is not None and not any(finite(r.get(key)) for r in history):
        return f"{key} not logged" + (": beta = 0" if key == "kl" else "")
    if name == "reward_conflict" and len(reward_keys(history)) < 2:
        return "one reward function"
    return "too few logged steps"


def monitor_of(trainer: Any) -> HealthCallback | None:
    """The trainer's health monitor, if it has one."""
    handler = getattr(trainer, "callback_handler", None)
    return next((c for c in getattr(handler, "callbacks", ()) if isinstance(c, HealthCallback)), None)


def attach_health(trainer: Any, read: Callable[[Any], Thresholds] | None = None) -> None:
    """Put a :class:`HealthCallback` (its thresholds from ``read(args)``) first in ``trainer``'s callbacks unless it
    has one already (whether a run has one at all, ``slimrl_health``, the patching layer decides)."""
    if monitor_of(trainer) is not None:
        return
    trainer.callback_handler.callbacks.insert(0, HealthCallback(read=read))
