"""The ``training_step`` / ``prediction_step`` wrappers every patched trainer shares.

* :func:`running`: while a patched trainer's step runs, it is the *current* trainer (one built before the patch is
  named once), so code that TRL calls
  without the trainer (the fused LM head's kernel, :mod:`slimrl.patching.routes.fused_head`) reads slimrl's fields
  (``unsloth_num_chunks``, ``unsloth_logit_chunk_multiplier``) from its config and counts its work in its state.
* :func:`training_step_factory`: the step inside :func:`running`, then the NaN/inf stop
  (:func:`slimrl.patching.every_trainer.nonfinite.check_finite_step`); with fp16 loss scaling, the scaler's skipped
  steps are counted instead (:func:`slimrl.patching.every_trainer.nonfinite.count_skipped_scaler_step`).
* :func:`prediction_step_factory`: evaluation inside :func:`running`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from slimrl.compat.runtime.callsite import warn
from slimrl.models.modes import trainer_step
from slimrl.patching.every_trainer.nonfinite import check_finite_step, count_skipped_scaler_step
from slimrl.patching.every_trainer.state import trainer_state

_CURRENT: ContextVar[Any] = ContextVar("slimrl_current_trainer", default=None)


@contextmanager
def running(trainer: Any) -> Iterator[None]:
    """Make ``trainer`` the current one for the duration of a step (first saying, once, when it was built before
    slimrl patched its class)."""
    _say_if_built_before(trainer)
    token = _CURRENT.set(trainer)
    try:
        with trainer_step():
            yield
    finally:
        _CURRENT.reset(token)


def _say_if_built_before(trainer: Any) -> None:
    """A trainer built before ``PatchFastRL`` skipped slimrl's construction-time checks and hooks but now runs its
    patched steps: one line at its first step (noticed here, where it shows, rather than by scanning every live
    object when ``PatchFastRL`` runs)."""
    state = trainer_state(trainer)
    if state.constructed or state.built_before_said:
        return
    state.built_before_said = True
    warn(
        f"this {type(trainer).__name__} was built before PatchFastRL patched its class: it missed slimrl's checks "
        f"and hooks at construction but now runs its patched methods (a mix of both); build the trainer after "
        f"PatchFastRL",
        UserWarning,
    )


def current_trainer() -> Any:
    """The patched trainer whose step is running, or None outside one."""
    return _CURRENT.get()


def current_args() -> Any:
    """The config of the patched trainer whose step is running, or None outside one."""
    return getattr(_CURRENT.get(), "args", None)


def training_step_factory(orig_training_step):
    """A trainer's ``training_step`` run inside :func:`running`, followed by the NaN/inf stop."""

    @functools.wraps(orig_training_step)
    def slimrl_training_step(self, model, inputs, *args, **kwargs):
        count_skipped_scaler_step(self)
        with running(self):
            loss = orig_training_step(self, model, inputs, *args, **kwargs)
        check_finite_step(self, model, loss)
        return loss

    return slimrl_training_step


def prediction_step_factory(orig_prediction_step):
    """A trainer's ``prediction_step`` (evaluation) run inside :func:`running`."""

    @functools.wraps(orig_prediction_step)
    def slimrl_prediction_step(self, *args, **kwargs):
        with running(self):
            return orig_prediction_step(self, *args, **kwargs)

    return slimrl_prediction_step


def push_to_hub_factory(orig_push_to_hub):
    """A trainer's ``push_to_hub`` where the Hugging Face Hub is switched off (``HF_HUB_OFFLINE=1``): the model is
    saved to ``output_dir`` as the push would have (``save_model``) and one line says the upload was skipped and how
    to make it, instead of ``huggingface_hub``'s offline-mode traceback at the end of a finished run. Online (or with
    ``SLIMRL_STRICT=1``) it is TRL's own ``push_to_hub``."""

    @functools.wraps(orig_push_to_hub)
    def slimrl_push_to_hub(self, *args, **kwargs):
        from huggingface_hub import constants

        from slimrl.patching.every_trainer.defaults import strict
        from slimrl.patching.every_trainer.state import config_state

        skipped = config_state(self.args).push_skipped  # the Hub was out of reach when the trainer was built
        if strict() or not (constants.HF_HUB_OFFLINE or skipped):
            return orig_push_to_hub(self, *args, **kwargs)
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else skipped
        self.save_model(self.args.output_dir)
        print(
            f"slimrl: push_to_hub skipped: {why}; the model is saved in {self.args.output_dir} "
            f"(call trainer.push_to_hub() when the Hub can be reached to upload it)",
            flush=True,
        )
        return None

    return slimrl_push_to_hub
