"""The support truncated sampling draws from, replayed on the trainer's logits, and the trainer's mass on it.

vLLM samples (``vllm/v1/sample/sampler.py``) from ``z = logits / T`` filtered in this order: ``min_p`` keeps tokens
with ``p_v >= min_p * max_u p_u``; ``top_k`` keeps tokens whose ``z`` is at least the ``k``-th largest (ties kept);
``top_p`` sorts what is left ascending, and drops a token while the cumulative mass up to and including it is
``<= 1 - top_p`` (the most likely token always stays). With ``logprobs_mode="processed_logprobs"`` (TRL's and
slimrl's engine setting) the log-prob it reports for a sampled token ``y`` is ``log p(y) - log S`` with
``S = sum_{v in K} p(v)`` over the kept set ``K``, while the trainer computes ``log p(y)`` over the whole vocabulary:
their difference carries ``log S`` into the importance-sampling ratio although the policy did not change (TRL issue
6789; TRL 1.17 renormalises the trainer's side over ``K`` instead: ``log p(y) - log S_trainer``).

:func:`log_kept_mass` gives ``log S`` under the trainer's distribution for the support the same filters keep on the
trainer's own logits (the engine's exact ``K`` is only returned by vLLM's model runner V2, not on a CPU).
"""

from __future__ import annotations

import torch


def kept_support(z: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """``[N, V]`` bool: the tokens vLLM's filters keep for temperature-scaled logits ``z`` ``[N, V]``."""
    keep = torch.ones_like(z, dtype=torch.bool)  # [N, V]
    if min_p > 0:
        probs = torch.softmax(z.float(), dim=-1)  # [N, V]
        keep &= probs >= probs.amax(dim=-1, keepdim=True) * min_p
    masked = z.masked_fill(~keep, float("-inf"))  # [N, V]
    if 0 < top_k < z.size(-1):
        kth = masked.topk(top_k, dim=-1).values[:, -1:]  # [N, 1]
        keep &= masked >= kth
        masked = masked.masked_fill(~keep, float("-inf"))
    if top_p < 1.0:
        ordered, order = masked.float().sort(dim=-1)  # ascending, [N, V]
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)  # [N, V]
        drop = cumulative <= 1 - top_p
        drop[:, -1] = False  # the most likely token always stays
        keep &= ~torch.zeros_like(drop).scatter(-1, order, drop)
    return keep


def log_kept_mass(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """``[N]``: ``log S``, the log of the trainer's probability (``softmax(logits / T)``) on the kept support, for
    ``logits`` ``[N, V]``; 0 where nothing is truncated. Computed in fp32."""
    z = logits.float() / temperature  # [N, V]
    keep = kept_support(z, top_k, top_p, min_p)  # [N, V]
    return torch.logsumexp(z.masked_fill(~keep, float("-inf")), dim=-1) - torch.logsumexp(z, dim=-1)


def truncates(top_k: int | None, top_p: float | None, min_p: float | None) -> bool:
    """Whether these settings truncate sampling (``top_k`` 0 or -1, ``top_p`` 1 and ``min_p`` 0 do not)."""
    return bool((top_k or 0) > 0 or (top_p is not None and top_p < 1.0) or (min_p or 0.0) > 0)
