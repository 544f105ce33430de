"""``slimrl_truncated_sampling_fix``: TRL 1.17's handling of truncated sampling in the vLLM importance-sampling
ratio, for TRL 1.12-1.16 (opt-in; off, the math is the installed TRL's).

With ``top_p < 1``, ``top_k > 0`` or ``min_p > 0`` the sampler reports each sampled token's log-prob in the
truncated distribution, ``log pi_s(y) - log S_s``, while the trainer scores ``log pi_t(y)`` over the whole
vocabulary, so TRL's ratio ``exp(log pi_t(y) - log pi_s(y) + log S_s)`` carries the kept mass ``S`` as if the policy
had changed (TRL issue 6789: mean ratio 0.896 at ``top_p=0.8``; masked or clamped by the correction). TRL 1.17
(PR 7269) puts the sampler's log-probs on the trainer's support: the trainer's log-prob renormalised over the kept
set ``K``, i.e. per completion token ``t``

    sampling'_t = sampling_t + log S_t,   S_t = sum_{v in K_t} softmax(z_t)_v,   z_t = logits_t / T

so that ``old_t - sampling'_t = (log pi_t(y_t) - log S_t) - log pi_s(y_t | K_t)``. ``K_t`` is the support vLLM's
filters keep on the trainer's logits (:mod:`slimrl.ops.sampling_support`; vLLM returns its own only from its
model runner V2). The corrected ``sampling_per_token_logps`` replace TRL's in the batch, so the ratio, TRL's
``sampling/*`` metrics and the off-policy mask (``off_policy_mask_threshold``) all read them; where TRL already
computed its ratio in the same call, it is recomputed with TRL's formula and TRL's five metrics of that call
replaced. Cost: one no-grad forward over the generation batch, in row slices, when the field is on and sampling
truncates.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from slimrl.compat.runtime.callsite import warn
from slimrl.compat.sampling import effective_sampling
from slimrl.ops.sampling_support import log_kept_mass, truncates
from slimrl.patching.every_trainer.extra_fields import fields_of
from slimrl.patching.online.mismatch import corrected_mask, is_ratio, sequence_level

FIELD = "slimrl_truncated_sampling_fix"
# batch keys of a vision-language generation batch: its forward needs the images (not replayed here)
_IMAGE_KEYS = ("pixel_values", "image_grid_thw", "pixel_attention_mask", "image_sizes")


def truncation(trainer: Any) -> dict[str, Any] | None:
    """The sampling settings the generator truncates with (:func:`slimrl.compat.sampling.effective_sampling`), or
    None when nothing truncates."""
    settings = effective_sampling(trainer.args)
    return settings if truncates(settings["top_k"], settings["top_p"], settings["min_p"]) else None


@torch.no_grad()
def batch_log_kept_mass(trainer: Any, output: dict, settings: dict[str, Any]) -> torch.Tensor:
    """``[B, C]``: ``log S_t`` of every completion position of the generation batch ``output``."""
    from slimrl.models.checkpointing import paused

    prompt_ids, completion_ids = output["prompt_ids"], output["completion_ids"]  # [B, P], [B, C]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, P + C]
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)  # [B, P + C]
    c = completion_ids.size(1)
    rows = max(1, fields_of(trainer.args).unsloth_grpo_mini_batch or trainer.args.per_device_train_batch_size)
    out = torch.zeros(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)  # [B, C]
    checkpointing = (
        paused(trainer.model, trainer.args.gradient_checkpointing_kwargs)
        if trainer.args.gradient_checkpointing
        else contextlib.nullcontext()
    )
    with checkpointing:
        for start in range(0, ids.size(0), rows):
            part = slice(start, start + rows)
            logits = trainer.model(input_ids=ids[part], attention_mask=mask[part], logits_to_keep=c + 1).logits[
                :, :-1
            ]  # [b, C, V]
            logits = logits[:, -c:]
            flat = log_kept_mass(
                logits.reshape(-1, logits.size(-1)),
                settings["temperature"],
                settings["top_k"],
                settings["top_p"],
                settings["min_p"],
            )  # [b * C]
            out[part] = flat.view(logits.size(0), c)
    return out


def trl_passes_kept_sets(output: dict) -> bool:
    """Whether this TRL already carries the sampler's kept set (TRL 1.17's ``support_ids``): seen in a kernel call
    (:data:`slimrl.patching.machinery.contracts.LATER_SEEN`) or in the generation batch."""
    from slimrl.patching.machinery.contracts import LATER_SEEN

    return "support_ids" in LATER_SEEN or any("support" in key for key in output)


def apply_support_fix(trainer: Any, output: dict) -> None:
    """Correct ``output`` (TRL's generation batch) in place as the module docstring says; no-op unless the field is
    on, the batch carries the sampler's log-probs and sampling truncates."""
    if not getattr(trainer.args, FIELD, False) or output.get("sampling_per_token_logps") is None:
        return
    from slimrl.compat.trl_info import trl_version

    if trl_version().release[:2] >= (1, 17) or trl_passes_kept_sets(output):  # TRL renormalises itself
        warn(
            f"{FIELD}: TRL {trl_version()} corrects truncated sampling itself (its calls carry the sampler's kept "
            f"set); the field does nothing here"
        )
        return
    settings = truncation(trainer)
    if settings is None:
        return
    if any(output.get(k) is not None for k in _IMAGE_KEYS):
        warn(f"{FIELD}: not applied to vision-language batches (the replay forward takes text only)")
        return
    mask = corrected_mask(output)  # [B, C]
    log_s = batch_log_kept_mass(trainer, output, settings)  # [B, C]
    output["sampling_per_token_logps"] = output["sampling_per_token_logps"] + log_s * mask  # NaN stays NaN
    if output.get("old_per_token_logps") is not None and output.get("importance_sampling_ratio") is not None:
        old, sampling = output["old_per_token_logps"], output["sampling_per_token_logps"]
        ratio = is_ratio(trainer, old, sampling, mask)
        output["importance_sampling_ratio"] = ratio
        replace_trl_metrics(trainer, old, sampling, mask, ratio)


def replace_trl_metrics(
    trainer: Any, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, ratio: torch.Tensor
) -> None:
    """TRL's five ``sampling/*`` values of this generation batch, recomputed as TRL computes them from the corrected
    log-probs (each replaces the value TRL just appended)."""
    from trl.trainer.utils import nanmax, nanmin

    mode = "train" if trainer.model.training else "eval"
    row, gather, zero = trainer._metrics[mode], trainer.accelerator.gather, old.new_zeros(())
    bool_mask = mask.bool()
    delta = torch.abs(old - sampling)
    delta = delta[bool_mask & ~torch.isnan(delta)]
    flat = ratio.flatten() if sequence_level(trainer.vllm_importance_sampling_mode) else ratio[bool_mask]
    values = {
        "sampling/sampling_logp_difference/mean": gather(delta.mean() if delta.numel() else zero).mean(),
        "sampling/sampling_logp_difference/max": gather(delta.max() if delta.numel() else zero).max(),
        "sampling/importance_sampling_ratio/min": nanmin(gather(flat.min() if flat.numel() else zero)),
        "sampling/importance_sampling_ratio/mean": gather(flat.mean() if flat.numel() else zero).nanmean(),
        "sampling/importance_sampling_ratio/max": nanmax(gather(flat.max() if flat.numel() else zero)),
    }
    for key, value in values.items():
        if row.get(key):
            row[key][-1] = value.item()
