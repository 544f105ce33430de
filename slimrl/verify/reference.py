"""A plain-torch stand-in for TRL's fused-head kernel, for the *reference* side of ``slimrl verify`` only.

TRL 1.15 ships its fused-head kernel for Triton alone and sets ``trl.trainer.utils._ChunkedLogProbFunction = None``
elsewhere, so its DPO, KTO, SFT, RLOO and GRPO cannot run on a CPU at all. To still compare slimrl with TRL's
code there, the reference run puts this kernel in that slot: full ``[N, V]`` fp32 logits, ``log_softmax``, gather
(the textbook math, autograd for the backward), with TRL's contract:

``apply(hidden [N, H], weight [V, H], bias, targets [N], temperature, chunk_size, softcap, logit_scale, outputs)
-> (log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)`` (None for what ``outputs`` does not ask).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from slimrl.compat.runtime.swaps import swapped


class ReferenceLogProbKernel:
    @staticmethod
    def apply(
        hidden, weight, bias, targets, temperature, chunk_size, softcap=None, logit_scale=1.0, outputs=("log_probs",)
    ):
        x = torch.nn.functional.linear(hidden.float(), weight.float(), None if bias is None else bias.float())
        x = x * logit_scale  # [N, V]
        if softcap is not None:
            x = softcap * torch.tanh(x / softcap)
        z = x / temperature
        logp_all = torch.log_softmax(z, dim=-1)  # [N, V]
        logps = logp_all.gather(1, targets.long()[:, None]).squeeze(1)  # [N]
        entropy = -(logp_all.exp() * logp_all).sum(-1) if "entropy" in outputs else None
        with torch.no_grad():
            sq = torch.logsumexp(2 * logp_all, dim=-1) if "log_sum_sq_probs" in outputs else None
            mean = z.mean(-1) if "mean_logits" in outputs else None
            top1 = (z.argmax(-1) == targets) if "is_top1" in outputs else None
        return logps, entropy, sq, mean, top1


def _empty_slot():
    """TRL's utils module when its fused-head kernel slot is empty (TRL 1.15 without Triton), else None."""
    try:
        import trl.trainer.utils as utils
    except ImportError:
        return None
    return utils if hasattr(utils, "_ChunkedLogProbFunction") and utils._ChunkedLogProbFunction is None else None


@contextmanager
def trl_kernel_where_missing() -> Iterator[bool]:
    """While active, TRL's empty fused-head kernel slot (TRL 1.15 without Triton) holds the reference kernel;
    yields whether it did."""
    utils = _empty_slot()
    if utils is None:
        yield False
        return
    with swapped(utils, "_ChunkedLogProbFunction", ReferenceLogProbKernel):
        yield True


def reference_note() -> str:
    """One line for the table when the reference needed the stand-in kernel, else ''."""
    if _empty_slot() is not None:
        return (
            "reference: TRL's own code with a plain torch kernel in its fused-head slot (this TRL has that "
            "kernel for Triton only, so TRL alone cannot run DPO/KTO/SFT/RLOO/GRPO here; slimrl can)"
        )
    return ""
