"""The comparison `slimrl verify` and the parity tests (tests/patching/parity.py) both make between a run with TRL
alone and the same run patched: relative errors of tensors, of every named parameter, of logged losses."""

from __future__ import annotations

import torch


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` (L2 norms, fp64; ``|b|`` floored at 1e-12): ``b`` is the reference."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def worst_parameter_error(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest :func:`relative_error` over the parameters both hold, and its name (NaN, "" when none)."""
    errors = [(relative_error(ours[name], t), name) for name, t in ref.items() if name in ours]
    return max(errors) if errors else (float("nan"), "")


def joint_error(ours: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """:func:`relative_error` of all of ``ref``'s tensors as one vector (a parameter whose two steps nearly cancel
    does not magnify rounding there as it does in a per-parameter ratio)."""
    names = list(ref)
    if not names:
        return float("nan")
    return relative_error(torch.cat([ours[n].flatten() for n in names]), torch.cat([ref[n].flatten() for n in names]))


# A logged loss can be a sum of O(1) terms that cancel: GRPO's first step, at ratio 1, is minus the mean of
# advantages that sum to zero per group (~1e-6 of rounding), and fp32 sums of those terms in other orders differ by
# ~1e-7 absolute (seen: 9.5e-7 against 8.3e-7). The floor makes that an absolute tolerance of 1e-6 at verify's 1e-4.
LOSS_FLOOR = 1e-2


def loss_error(ours: list[float], ref: list[float], floor: float = LOSS_FLOOR) -> float:
    """The worst ``|a - b| / max(|b|, floor)`` over logged losses (:data:`LOSS_FLOOR`); inf when the runs logged
    different counts."""
    if len(ours) != len(ref):
        return float("inf")
    return max((abs(a - b) / max(abs(b), floor) for a, b in zip(ours, ref)), default=float("nan"))
