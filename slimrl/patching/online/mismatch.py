"""How far the sampler (vLLM, slimrl's engine, a server) is from the model being trained, per generation batch.

With ``d_t = log pi_trainer(y_t) - log pi_sampler(y_t)`` over the completion tokens TRL corrects (its mask, tool
outputs excluded; tokens the sampler could not score are left out) and ``r_t = exp(d_t)``:

* ``sampling/kl_k3/mean`` and ``/max``: the k3 estimator ``r - 1 - log r`` of KL(sampler || trainer) per token
  (Schulman 2020, "Approximating KL divergence"; unbiased and >= 0 for tokens drawn from the sampler), its mean
  over the tokens and its largest term;
* ``sampling/is_masked_share/token`` and ``/sequence``: the share of tokens and of sequences whose raw ratio
  (TRL's: per token in ``token_*`` modes, ``exp(sum_t d_t)`` per sequence in ``sequence_*`` modes) lies outside
  ``[vllm_importance_sampling_clip_min, clip_max]``, i.e. is masked to 0 (``*_mask``) or clamped (``*_truncate``)
  by TRL's correction (Yao et al. 2025, truncated/masked importance sampling); a sequence counts when any of its
  tokens does;
* ``sampling/raw_importance_sampling_ratio/min``, ``/mean``, ``/max``: that ratio before TRL masks or clamps it
  (TRL's ``sampling/importance_sampling_ratio/*`` are after).

The sums are kept per micro-batch and divided at the end, so a generation batch scored in several micro-batches
logs what one pass over all of it gives; across processes the sums are gathered before dividing.
"""

from __future__ import annotations

import math
from typing import Any

import torch

NAMES = (
    "sampling/kl_k3/mean",
    "sampling/kl_k3/max",
    "sampling/is_masked_share/token",
    "sampling/is_masked_share/sequence",
    "sampling/raw_importance_sampling_ratio/min",
    "sampling/raw_importance_sampling_ratio/mean",
    "sampling/raw_importance_sampling_ratio/max",
)


def sequence_level(mode: str) -> bool:
    return mode in ("sequence_mask", "sequence_truncate")


def bounds(trainer: Any) -> tuple[float, float]:
    lo, hi = trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max
    return -math.inf if lo is None else lo, math.inf if hi is None else hi


def is_ratio(trainer: Any, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's vLLM importance-sampling ratio (``_generate_and_score_completions``, TRL 1.12-1.16): ``[B, C]`` in
    ``token_*`` modes, ``[B, 1]`` in ``sequence_*`` modes, clamped (``*_truncate``) or zeroed outside the bounds
    (``*_mask``)."""
    mode = trainer.vllm_importance_sampling_mode
    diff = torch.nan_to_num((old - sampling) * mask, nan=0.0)  # [B, C]
    ratio = torch.exp(diff.sum(dim=-1, keepdim=True) if sequence_level(mode) else diff)  # [B, 1] or [B, C]
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(
            ratio, min=trainer.vllm_importance_sampling_clip_min, max=trainer.vllm_importance_sampling_clip_max
        )
    if mode in ("sequence_mask", "token_mask"):
        lo, hi = bounds(trainer)
        return ratio.masked_fill((ratio < lo) | (ratio > hi), value=0.0)
    raise ValueError(f"Unknown vLLM importance sampling level: {mode}")


def mismatch_sums(trainer: Any, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor) -> dict:
    """The module docstring's statistics of one micro-batch as sums (``old``, ``sampling``, ``mask``: ``[B, C]``)."""
    valid = mask.bool() & ~torch.isnan(sampling)  # [B, C]
    diff = torch.where(valid, old.float() - sampling.float(), 0.0)  # [B, C]
    k3 = torch.where(valid, torch.expm1(diff) - diff, 0.0)  # [B, C], >= 0
    lo, hi = bounds(trainer)
    rows = valid.any(dim=-1)  # [B] sequences with a scored token
    if sequence_level(trainer.vllm_importance_sampling_mode):
        raw = torch.exp(diff.sum(dim=-1))[rows]  # [S]
        out_seq = torch.zeros_like(rows)
        out_seq[rows] = (raw < lo) | (raw > hi)
        out_tok = valid & out_seq[:, None]  # [B, C]
    else:
        raw = torch.exp(diff)[valid]  # [N]
        out_tok = valid & ((torch.exp(diff) < lo) | (torch.exp(diff) > hi))  # [B, C]
        out_seq = out_tok.any(dim=-1)  # [B]
    zero = diff.new_zeros(())
    return {
        "k3_sum": k3.sum(),
        "k3_max": k3.max() if k3.numel() else zero,
        "tokens": valid.sum().float(),
        "masked_tokens": out_tok.sum().float(),
        "sequences": rows.sum().float(),
        "masked_sequences": out_seq.sum().float(),
        "raw_sum": raw.sum(),
        "raw_n": diff.new_tensor(float(raw.numel())),
        "raw_min": raw.min() if raw.numel() else diff.new_tensor(math.inf),
        "raw_max": raw.max() if raw.numel() else diff.new_tensor(-math.inf),
    }


def add_sums(total: dict | None, part: dict) -> dict:
    """Two micro-batches' sums as one (maxima and minima kept as such)."""
    if total is None:
        return dict(part)
    how = {"k3_max": torch.maximum, "raw_max": torch.maximum, "raw_min": torch.minimum}
    return {k: how.get(k, torch.add)(total[k], v) for k, v in part.items()}


def log_mismatch(trainer: Any, sums: dict, mode: str = "train") -> dict[str, float]:
    """Append the statistics to the trainer's metrics row (TRL averages each over the logging interval); returns
    them."""
    gathered = {k: trainer.accelerator.gather(v.detach().reshape(1).float()) for k, v in sums.items()}
    total = {k: v.sum() for k, v in gathered.items()}
    tokens, seqs, raw_n = (total[k].item() for k in ("tokens", "sequences", "raw_n"))
    if tokens == 0:
        return {}
    values = {
        "sampling/kl_k3/mean": total["k3_sum"].item() / tokens,
        "sampling/kl_k3/max": gathered["k3_max"].max().item(),
        "sampling/is_masked_share/token": total["masked_tokens"].item() / tokens,
        "sampling/is_masked_share/sequence": total["masked_sequences"].item() / max(seqs, 1.0),
        "sampling/raw_importance_sampling_ratio/min": gathered["raw_min"].min().item(),
        "sampling/raw_importance_sampling_ratio/mean": total["raw_sum"].item() / max(raw_n, 1.0),
        "sampling/raw_importance_sampling_ratio/max": gathered["raw_max"].max().item(),
    }
    for name, value in values.items():
        trainer._metrics[mode][name].append(value)
    return values


def corrected_mask(inputs: dict) -> torch.Tensor:
    """The tokens TRL's correction covers: the completion mask, times the tool mask where tools ran."""
    mask = inputs["completion_mask"]
    return mask if inputs.get("tool_mask") is None else mask * inputs["tool_mask"]
