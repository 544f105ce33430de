"""No redundant old-log-prob pass: GRPO's vLLM importance-sampling correction from the policy forward.

With ``use_vllm=True`` and ``vllm_importance_sampling_correction=True`` (TRL's defaults with vLLM, so also with
slimrl's engine) TRL's ``_generate_and_score_completions`` runs a no-grad forward of the policy over the whole
generation batch for ``old_per_token_logps`` and corrects the sampler/trainer mismatch with (Yao et al. 2025,
"Your efficient RL framework secretly brings you off-policy RL training", truncated/masked IS)

    r_t = exp(log pi_old(y_t) - log pi_vllm(y_t))          token_* modes, [B, C]
    r   = exp(sum_t (log pi_old(y_t) - log pi_vllm(y_t)))   sequence_* modes, [B, 1]

truncated to ``[clip_min, clip_max]`` or masked to 0 outside it. When generation is aligned with the optimizer
steps (TRL's own test: ``gradient_accumulation_steps % (steps_per_generation * num_iterations) == 0``), in train
mode and with no dropout, the policy cannot change between the generation and any loss micro-batch of that
generation batch, so ``pi_old`` equals the with-grad forward's log-probs, detached (TRL's own loss uses
``per_token_logps.detach()`` as ``old`` when it skips the pass for the same reason without vLLM). slimrl then:

1. :func:`generate_and_score_factory`: runs TRL's ``_generate_and_score_completions`` with the correction off for
   that call, so TRL skips the pass (``old_per_token_logps = None``, its aligned branch); the sampled-token
   log-probs (``sampling_per_token_logps``) stay in the batch;
2. :func:`compute_loss_factory` + :func:`fill_importance_ratio`: in ``_compute_loss``, right after the policy's
   log-probs are computed (the GRPO log-prob method calls :func:`fill_importance_ratio`), puts TRL's
   ``importance_sampling_ratio`` into the micro-batch from those log-probs, detached, with TRL's formula, and
   logs TRL's ``sampling/*`` metrics once per generation batch from the sums over its micro-batches (the same
   values TRL computes over the whole batch).

Both ways, the generation batch also gets the sampler-trainer statistics (:mod:`slimrl.patching.online.mismatch`)
and, when asked, TRL 1.17's handling of truncated sampling (:mod:`slimrl.patching.online.truncated_sampling`).

Anywhere the condition does not hold (eval, misaligned generation, ``num_iterations`` with an early optimizer
step, dropout active, Liger's loss, ``slimrl_reuse_old_logps=False``), TRL's pass runs unchanged.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from slimrl.patching.every_trainer.extra_fields import fields_of
from slimrl.patching.every_trainer.state import trainer_state
from slimrl.patching.online.mismatch import (
    add_sums,
    corrected_mask,
    is_ratio,
    log_mismatch,
    mismatch_sums,
    sequence_level,
)
from slimrl.patching.online.truncated_sampling import apply_support_fix


def _dropout_active(model: Any) -> bool:
    """Whether a forward in train mode is random (then two forwards differ and the pass cannot be reused)."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0 and module.training:
            return True
    config = getattr(model, "config", None)
    return bool(config is not None and getattr(config, "attention_dropout", 0.0)) and model.training


def can_reuse(trainer: Any) -> bool:
    """TRL would run the old-log-prob pass only for the vLLM IS correction, and its result equals the policy
    forward's (see the module docstring)."""
    args = trainer.args
    generate_every = args.steps_per_generation * trainer.num_iterations
    return bool(
        fields_of(args).slimrl_reuse_old_logps
        and getattr(trainer, "use_vllm", False)
        and trainer.vllm_importance_sampling_correction
        and trainer.model.training
        and args.gradient_accumulation_steps % generate_every == 0
        and not getattr(trainer, "use_liger_kernel", False)
        and not _dropout_active(trainer.model)
    )


@dataclass
class _Window:
    """IS statistics of one generation batch, summed over its micro-batches (first pass over each)."""

    micro_batches: int  # steps_per_generation: the generation batch's micro-batches
    seen: int = 0
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    mismatch: dict | None = None  # the sampler-trainer statistics (:mod:`slimrl.patching.online.mismatch`)

    def add(self, name: str, value: torch.Tensor, how: str) -> None:
        if name not in self.sums:
            self.sums[name] = value
        elif how == "sum":
            self.sums[name] = self.sums[name] + value
        else:
            self.sums[name] = getattr(torch, how)(self.sums[name], value)


def generate_and_score_factory(orig):
    """``GRPOTrainer._generate_and_score_completions`` without the old-log-prob pass where it can be reused."""

    @functools.wraps(orig)
    def slimrl_generate_and_score_completions(self, *args, **kwargs):
        if not can_reuse(self):
            trainer_state(self).is_window = None
            out = orig(self, *args, **kwargs)
            apply_support_fix(self, out)
            _log_whole_batch(self, out)
            return out
        self.vllm_importance_sampling_correction = False
        try:
            out = orig(self, *args, **kwargs)
        finally:
            self.vllm_importance_sampling_correction = True
        apply_support_fix(self, out)
        trainer_state(self).is_window = _Window(micro_batches=self.args.steps_per_generation)
        return out

    return slimrl_generate_and_score_completions


def _log_whole_batch(trainer: Any, out: dict) -> None:
    """The sampler-trainer statistics of a generation batch TRL corrected itself (its old-log-prob pass ran)."""
    if not (getattr(trainer, "use_vllm", False) and trainer.vllm_importance_sampling_correction):
        return
    old, sampling = out.get("old_per_token_logps"), out.get("sampling_per_token_logps")
    if old is not None and sampling is not None:
        log_mismatch(
            trainer,
            mismatch_sums(trainer, old, sampling, corrected_mask(out)),
            "train" if trainer.model.training else "eval",
        )


def compute_loss_factory(orig):
    """``GRPOTrainer._compute_loss`` with the IS ratio filled from the policy forward (when the pass was skipped)."""

    @functools.wraps(orig)
    def slimrl_compute_loss(self, model, inputs):
        pending = (
            trainer_state(self).is_window is not None
            and self.model.training
            and "old_per_token_logps" not in inputs
            and "sampling_per_token_logps" in inputs
        )
        trainer_state(self).is_inputs = inputs if pending else None
        try:
            return orig(self, model, inputs)
        finally:
            trainer_state(self).is_inputs = None

    return slimrl_compute_loss


def fill_importance_ratio(trainer: Any, per_token_logps: torch.Tensor) -> None:
    """Called by the GRPO log-prob method with the policy's log-probs ``[B, C]`` (with grad): when this micro-batch
    skipped TRL's pass, put ``importance_sampling_ratio`` into it (TRL's formula, ``old = per_token_logps.detach()``)
    and count its statistics; no-op otherwise."""
    inputs = trainer_state(trainer).is_inputs
    if inputs is None or not torch.is_grad_enabled():
        return
    trainer_state(trainer).is_inputs = None  # the first call is the policy's; later ones (none in TRL) are not
    old = per_token_logps.detach()  # [B, C]
    sampling = inputs["sampling_per_token_logps"]  # [B, C]
    mask = corrected_mask(inputs)  # [B, C]
    ratio = is_ratio(trainer, old, sampling, mask)  # [B, 1] or [B, C]
    inputs["importance_sampling_ratio"] = ratio
    _count(trainer, old, sampling, mask, ratio, sequence_level(trainer.vllm_importance_sampling_mode))


def _count(trainer: Any, old, sampling, mask, ratio, sequence_level: bool) -> None:
    """Add one micro-batch to the generation batch's IS statistics; log TRL's ``sampling/*`` metrics after its
    last micro-batch (TRL: per-process mean/min/max over the batch, then gathered)."""
    window: _Window | None = trainer_state(trainer).is_window
    if window is None or window.seen >= window.micro_batches:
        return  # later iterations over the same batch (num_iterations > 1): TRL logs once per generation
    window.seen += 1
    bool_mask = mask.bool()
    delta = torch.abs(old - sampling)
    delta = delta[bool_mask & ~torch.isnan(delta)]
    flat = ratio.flatten() if sequence_level else ratio[bool_mask]
    zero = old.new_zeros(())
    window.add("delta_sum", delta.sum(), "sum")
    window.add("delta_n", old.new_tensor(float(delta.numel())), "sum")
    window.add("delta_max", delta.max() if delta.numel() else zero, "maximum")
    window.mismatch = add_sums(window.mismatch, mismatch_sums(trainer, old, sampling, mask))
    window.add("ratio_sum", flat.sum(), "sum")
    window.add("ratio_n", old.new_tensor(float(flat.numel())), "sum")
    if flat.numel():
        window.add("ratio_min", flat.min(), "minimum")
        window.add("ratio_max", flat.max(), "maximum")
    if window.seen < window.micro_batches:
        return
    from trl.trainer.utils import nanmax, nanmin

    s = window.sums
    gather = trainer.accelerator.gather
    mean_delta = s["delta_sum"] / s["delta_n"] if s["delta_n"] > 0 else zero
    mean_ratio = s["ratio_sum"] / s["ratio_n"] if s["ratio_n"] > 0 else zero
    row = trainer._metrics["train"]
    row["sampling/sampling_logp_difference/mean"].append(gather(mean_delta).mean().item())
    row["sampling/sampling_logp_difference/max"].append(gather(s["delta_max"]).max().item())
    row["sampling/importance_sampling_ratio/min"].append(nanmin(gather(s.get("ratio_min", zero))).item())
    row["sampling/importance_sampling_ratio/mean"].append(gather(mean_ratio).nanmean().item())
    row["sampling/importance_sampling_ratio/max"].append(nanmax(gather(s.get("ratio_max", zero))).item())
    log_mismatch(trainer, window.mismatch)
