"""Stop a training step whose loss or gradients are NaN/inf before the optimizer applies them.

``Trainer.training_step`` returns after the backward and before ``optimizer.step`` (which the Trainer's loop calls
at the end of the accumulation window), so raising here leaves the weights, the optimizer state and every
checkpoint already written as they were: the adapter is not corrupted and training can resume from the last
checkpoint with a fix (a lower learning rate, bf16/fp32 instead of fp16, a bounded reward).

The guard never stops a run that TRL completes for a reason TRL handles itself:

* ``fp16=True`` (a gradient scaler): while the scale calibrates, inf gradients are normal; the scaler sees them
  after unscaling and skips that optimizer step, so nothing non-finite reaches the weights. Those steps are left
  to the scaler and counted (:func:`count_skipped_scaler_step`, metric ``fp16/skipped_steps``).
* float16 *weights* trained without a scaler (e.g. ``model_init_kwargs={"dtype": torch.float16}``): overflow to
  inf is how that precision behaves and TRL applies the step as it is; slimrl warns once and does not stop.

Everywhere else (fp32 / bf16 weights) a NaN/inf loss or gradient would be written into the weights by the
optimizer: that is what the guard stops. The check is one fused reduction (``torch._foreach_norm`` over every
gradient, one host sync), not one sync per parameter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from slimrl.compat.runtime.callsite import warn
from slimrl.patching.every_trainer.state import trainer_state


class NonFiniteStepError(FloatingPointError):
    """The step's loss or a gradient is NaN/inf; nothing was applied to the model."""


def _last_checkpoint(output_dir: str | None) -> str | None:
    if not output_dir or not Path(output_dir).is_dir():
        return None
    ckpts = sorted(
        Path(output_dir).glob("checkpoint-*"),
        key=lambda p: int(p.name.rsplit("-", 1)[-1]) if p.name.rsplit("-", 1)[-1].isdigit() else -1,
    )
    return str(ckpts[-1]) if ckpts else None


def scaler_enabled(trainer: Any) -> bool:
    """Whether the trainer's accelerator scales the loss (``fp16=True`` with a GradScaler)."""
    scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
    return scaler is not None and bool(getattr(scaler, "is_enabled", lambda: True)())


def _scale(scaler: Any) -> float | None:
    """The scaler's current loss scale (one host sync), None where it has none to report."""
    try:
        return float(scaler.get_scale())
    except (AttributeError, RuntimeError, TypeError):
        return None


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite: one ``_foreach_norm`` (inf-norm: NaN and inf propagate) per
    device and dtype, the norms summed in fp32, one host sync."""
    if not tensors:
        return True
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    flags = []
    for group in groups.values():
        norms = torch._foreach_norm(group, float("inf"))  # one value per tensor, NaN/inf if any element is
        flags.append(torch.stack([n.float() for n in norms]).isfinite().all())
    device = flags[0].device
    return bool(torch.stack([f.to(device) for f in flags]).all())


def check_finite_step(trainer: Any, model: torch.nn.Module, loss: torch.Tensor) -> None:
    """Raise :class:`NonFiniteStepError` naming the step and the likely causes when ``loss`` or any gradient of a
    trainable parameter is not finite (checked after the backward, before the optimizer step); see the module
    docstring for the cases left to TRL."""
    if scaler_enabled(trainer):
        return
    params = [(name, p) for name, p in model.named_parameters() if p.grad is not None]
    grads = [p.grad for _, p in params]
    checked = [loss.detach().reshape(-1)] if isinstance(loss, torch.Tensor) else []
    if all_finite(grads + checked):  # the loss and the gradients in one host sync
        return
    loss_ok = not checked or all_finite(checked)  # only on the failure path
    step = trainer.state.global_step + 1
    if any(p.dtype == torch.float16 for _, p in params):
        if not trainer_state(trainer).fp16_warned:
            trainer_state(trainer).fp16_warned = True
            warn(
                f"step {step}: non-finite loss or gradients with float16 weights (fp16 overflow); TRL "
                f"applies the step as it is. Train in bfloat16/float32 or lower the learning rate.",
                RuntimeWarning,
            )
        return
    if not loss_ok:
        what = f"the loss is {loss.item()}"
    else:
        name = next(n for n, p in params if not torch.isfinite(p.grad).all())  # only on the failure path
        what = f"the gradient of {name} has NaN/inf values"
    args = trainer.args
    ckpt = _last_checkpoint(getattr(args, "output_dir", None))
    kept = (
        f"the last checkpoint ({ckpt}) is intact: resume from it after the fix"
        if ckpt
        else "no checkpoint was written yet"
    )
    raise NonFiniteStepError(
        f"step {step}: {what}; the update was not applied. Likely causes: learning_rate={args.learning_rate} too "
        f"high, a reward function returning huge values, or a corrupt input row. Nothing was changed in the "
        f"model; {kept}"
    )


def count_skipped_scaler_step(trainer: Any) -> None:
    """With a gradient scaler, count the optimizer steps it skipped (non-finite scaled gradients) into the
    trainer's metrics as ``fp16/skipped_steps`` (a running total). Called at the start of each training step: the
    previous optimizer step, if one ran since the last call, is the one inspected. A skipped step is one whose
    ``scaler.update()`` lowered the scale (it only lowers it after non-finite gradients), or one accelerate flags:
    with a fused optimizer (transformers' default ``adamw_torch_fused``) the scaler hands the inf check to the
    optimizer's own step, which accelerate then counts as taken (seen on an H200: ``optimizer_step_was_skipped``
    False after an inf step)."""
    if not scaler_enabled(trainer):
        return
    step, state = trainer.state.global_step, trainer_state(trainer)
    stepped = state.seen_step is not None and state.seen_step != step  # an optimizer step ran since the last call
    state.seen_step = step
    if not stepped and state.seen_scale is not None:
        return  # another micro-batch of the same optimizer step: its scale is the one already seen
    scale, before = _scale(trainer.accelerator.scaler), state.seen_scale  # the scale: one host sync per step
    state.seen_scale = scale
    if not stepped:
        return
    lowered = scale is not None and before is not None and scale < before
    if lowered or trainer.accelerator.optimizer_step_was_skipped:
        state.skipped_steps += 1
    metrics = getattr(trainer, "_metrics", None)
    if isinstance(metrics, dict) and isinstance(metrics.get("train"), dict):
        metrics["train"].setdefault("fp16/skipped_steps", []).append(float(state.skipped_steps))
