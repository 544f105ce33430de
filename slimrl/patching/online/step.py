"""The ``training_step`` both online trainers get: every trainer's step (:func:`slimrl.patching.every_trainer.steps.
training_step_factory`: the config made current, the NaN/inf stop, fp16 skipped steps) around the online parts:
the out-of-memory splits' metric and longest-first's failure message (:func:`slimrl.patching.online.oom.step`), the
engine's metrics (:func:`slimrl.patching.online.engine_hooks.log_engine_metrics`) and, with ``step_metrics``,
``memory/peak_mb`` (the step's peak, generation included, through :func:`slimrl.compat.memory.peak_window`, which
the engine's own resets cannot shorten) and ``tokens_per_s`` (completion tokens trained / step wall time,
generation included)."""

from __future__ import annotations

import functools
import time

from slimrl.compat.memory import peak_window
from slimrl.patching.every_trainer.state import trainer_state
from slimrl.patching.every_trainer.steps import training_step_factory
from slimrl.patching.online import oom
from slimrl.patching.online.engine_hooks import log_engine_metrics


def online_training_step_factory(orig_training_step, step_metrics: bool = False):
    """``training_step`` wrapped as the module docstring says."""

    @functools.wraps(orig_training_step)
    def slimrl_online_step(self, model, inputs, *args, **kwargs):
        trainer_state(self).trained_tokens = 0
        t0 = time.perf_counter()
        with peak_window(self.accelerator.device) as window, oom.step(self):
            out = orig_training_step(self, model, inputs, *args, **kwargs)
        if step_metrics:
            dt = time.perf_counter() - t0
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["memory/peak_mb"].append(window.peak_bytes() / 2**20)
            self._metrics[mode]["tokens_per_s"].append(trainer_state(self).trained_tokens / dt if dt > 0 else 0.0)
        log_engine_metrics(self)
        return out

    return training_step_factory(slimrl_online_step)
