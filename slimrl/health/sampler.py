"""The run-health check of the sampler against the trainer (``sampler_mismatch``): does the generator (vLLM,
slimrl's engine, a server) sample from the model being trained?

It reads what the patched GRPO trainer logs per generation batch (``sampling/kl_k3/mean``: the k3 KL between sampler
and trainer per token; ``sampling/is_masked_share/sequence``: the share of sequences TRL's importance-sampling
correction masks or clamps; ``sampling/raw_importance_sampling_ratio/mean``: the ratio before it does) and holds
when, over the window, the KL averages ``slimrl_health_mismatch_kl`` or more, the masked share
``slimrl_health_mismatch_masked`` or more, or the mean ratio lies below ``1 - x`` or above ``1 / (1 - x)`` with
``x = slimrl_health_mismatch_ratio`` (TRL's default mode masks only above its cap, so sequences weighted towards 0
— truncated sampling's bias multiplies every token's ratio by the kept mass — are dropped without being counted).

Its message names the likeliest of three causes, in this order:

1. **adapter not synced**: the KL was small at the first logged step (before any update reached the generator) and
   the newest is more than four times larger: the trainer moved and the generator did not follow (a missed or
   stale sync);
2. **truncated sampling on a release with the biased ratio**: ``top_p < 1``, ``top_k > 0`` or ``min_p > 0`` on TRL
   before 1.17 without ``slimrl_truncated_sampling_fix``: the ratio carries the kept mass ``log S`` per token;
3. **precision**: otherwise — the generator computes in other precision or kernels than the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

KL_KEY = "sampling/kl_k3/mean"
MASKED_KEY = "sampling/is_masked_share/sequence"
RATIO_KEY = "sampling/raw_importance_sampling_ratio/mean"
FIX = "slimrl_truncated_sampling_fix"
# the first logged KL below this share of the newest: the mismatch came with the updates
JUMP = 0.25
# a logged mean ratio below this under truncated sampling on a biased release holds at once, without a window: the
# kept mass per token compounds over a completion (0.001 logged by Unsloth's notebooks with min_p), and every step
# until the window fills trains on sequences weighted towards 0
COLLAPSED = 0.1


@dataclass(frozen=True)
class SamplerFacts:
    """What the config says about the generator (read once from the trainer's arguments)."""

    truncation: str = ""  # "top_p=0.8, top_k=20", "" when sampling does not truncate
    biased_ratio: bool = False  # the installed TRL's ratio is biased under truncation and the fix is off
    trainer_precision: str = "fp32"
    trl: str = ""

    @classmethod
    def from_args(cls, args: Any, fix: bool = False) -> SamplerFacts:
        """``fix``: the config's ``slimrl_truncated_sampling_fix`` (read by the caller, through the typed fields)."""
        from slimrl.compat.sampling import effective_sampling
        from slimrl.compat.trl_info import trl_version

        settings = effective_sampling(args)
        parts = [
            f"top_p={settings['top_p']:g}" if settings["top_p"] < 1 else "",
            f"top_k={settings['top_k']}" if settings["top_k"] > 0 else "",
            f"min_p={settings['min_p']:g}" if settings["min_p"] > 0 else "",
        ]
        truncation = ", ".join(p for p in parts if p)
        version = trl_version()
        old_trl = (version.major, version.minor) < (1, 17)
        precision = "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32"
        return cls(truncation, bool(truncation) and old_trl and not fix, precision, str(version))


def _window_mean(rows: Sequence[dict], key: str, window: int) -> float | None:
    last = rows[-window:]
    values = [r.get(key) for r in last]
    if len(last) < window or not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
        return None
    return sum(values) / window


def sampler_mismatch(rows: Sequence[dict], t: Any) -> tuple[bool, str] | None:
    """The check (module docstring); ``t``: :class:`slimrl.health.checks.Thresholds`."""
    facts: SamplerFacts = t.sampler or SamplerFacts()
    if facts.biased_ratio and rows and _window_mean(rows, RATIO_KEY, 1) is not None and rows[-1][RATIO_KEY] < COLLAPSED:
        return True, (
            f"the generator disagrees with the trained model: the importance ratio collapsed at step "
            f"{rows[-1].get('step', '?')} (mean {rows[-1][RATIO_KEY]:.3g}, below {COLLAPSED:g}); likely "
            f"cause: {_truncation_cause(facts)}"
        )
    kl = _window_mean(rows, KL_KEY, t.window)
    masked = _window_mean(rows, MASKED_KEY, t.window)
    ratio = _window_mean(rows, RATIO_KEY, t.window)
    if kl is None and masked is None:
        return None
    high_kl = kl is not None and kl >= t.mismatch_kl
    high_masked = masked is not None and masked >= t.mismatch_masked
    off_ratio = ratio is not None and not (1 - t.mismatch_ratio <= ratio <= 1 / (1 - t.mismatch_ratio))
    if not (high_kl or high_masked or off_ratio):
        return False, ""
    last = rows[-t.window :]
    span = f"steps {last[0].get('step', '?')}-{last[-1].get('step', '?')}"
    seen = (
        f"the generator disagrees with the trained model ({span}: KL {kl or 0.0:.3g} nats per token, "
        f"{masked or 0.0:.0%} of sequences masked or clamped by the importance-sampling correction, mean ratio "
        f"{ratio if ratio is not None else float('nan'):.3g}; limits slimrl_health_mismatch_kl={t.mismatch_kl:g}, "
        f"slimrl_health_mismatch_masked={t.mismatch_masked:g}, slimrl_health_mismatch_ratio={t.mismatch_ratio:g})"
    )
    logged = [r[KL_KEY] for r in rows if isinstance(r.get(KL_KEY), int | float) and math.isfinite(r[KL_KEY])]
    first = logged[0] if len(logged) >= 2 else None
    if first is not None and first < JUMP * logged[-1]:
        return True, (
            f"{seen}; likely cause: the adapter is not synced — the KL was {first:.3g} at the first "
            f"logged step, before any update reached the generator: check that the generator gets "
            f"the new weights every step (a vLLM server needs the trainer's sync; `slimrl verify` "
            f"with your generator finds a stale adapter)"
        )
    if facts.biased_ratio:
        return True, f"{seen}; likely cause: {_truncation_cause(facts)}"
    return True, (
        f"{seen}; likely cause: precision — the generator computes in other precision or kernels than "
        f"the trainer ({facts.trainer_precision}): run the generator in the trainer's dtype (or train "
        f"in bf16 with a bf16 generator), or use vllm_importance_sampling_mode='token_truncate' so a few "
        f"disagreeing tokens do not drop whole sequences"
    )


def _truncation_cause(facts: SamplerFacts) -> str:
    return (
        f"truncated sampling ({facts.truncation}) — TRL {facts.trl} compares the sampler's log-probs over the "
        f"kept tokens with the trainer's over the whole vocabulary (the ratio carries the kept mass, TRL issue "
        f"6789): set {FIX}=True (TRL 1.17's correction) or sample with top_p=1.0, top_k=0, min_p=0"
    )
