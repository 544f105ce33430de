"""Stop a training step whose loss or gradients are NaN/inf before the optimizer applies them.

``Trainer.training_step`` returns after the backward and before ``optimizer.step`` (which the Trainer's loop calls
at the end of the accumulation window), so raising here leaves the weights, the optimizer state and every
checkpoint already written as they were: the adapter is not corrupted and training can resume from the last
checkpoint with a fix (a lower learning rate, bf16/fp32 instead of fp16, a bounded reward).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


class NonFiniteStepError(FloatingPointError):
    """The step's loss or a gradient is NaN/inf; nothing was applied to the model."""


def _last_checkpoint(output_dir: str | None) -> str | None:
    if not output_dir or not Path(output_dir).is_dir():
        return None
    ckpts = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[-1])
                   if p.name.rsplit("-", 1)[-1].isdigit() else -1)
    return str(ckpts[-1]) if ckpts else None


def check_finite_step(trainer: Any, model: torch.nn.Module, loss: torch.Tensor) -> None:
    """Raise :class:`NonFiniteStepError` naming the step and the likely causes when ``loss`` or any gradient of a
    trainable parameter is not finite (checked after the backward, before the optimizer step)."""
    what = None
    if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss).all()):
        what = f"the loss is {loss.item()}"
    else:
        for name, param in model.named_parameters():
            if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
                what = f"the gradient of {name} has NaN/inf values"
                break
    if what is None:
        return
    args = trainer.args
    step = trainer.state.global_step + 1
    ckpt = _last_checkpoint(getattr(args, "output_dir", None))
    kept = f"the last checkpoint ({ckpt}) is intact: resume from it after the fix" if ckpt else \
        "no checkpoint was written yet"
    raise NonFiniteStepError(
        f"step {step}: {what}; the update was not applied. Likely causes: learning_rate={args.learning_rate} too "
        f"high, fp16 overflow (fp16={getattr(args, 'fp16', False)}: use bf16 or fp32), a reward function "
        f"returning huge values, or a corrupt input row. Nothing was changed in the model; {kept}")


def finite_step_factory(orig_training_step):
    """A trainer's ``training_step`` followed by :func:`check_finite_step` (for trainers whose module has no
    ``training_step`` replacement of its own; GRPO's calls the check itself)."""
    import functools

    @functools.wraps(orig_training_step)
    def slimrl_finite_training_step(self, model, inputs, *args, **kwargs):
        loss = orig_training_step(self, model, inputs, *args, **kwargs)
        check_finite_step(self, model, loss)
        return loss

    return slimrl_finite_training_step
