"""Chunked LM head + log-softmax + gather (+ entropy) without materialising ``[N, V]`` logits.

For rows ``h_n`` (last hidden states), head weight ``W [V, H]`` (+ bias ``b``), target ids ``t_n`` and temperature
``T``, with the model's logit transform ``g`` (scale ``s``, optional soft-cap ``c``):

    z_n   = g(W h_n + b) / T,             g(x) = c * tanh(s x / c)   (or s x without soft-cap)
    logp_n = z_n[t_n] - logsumexp(z_n)
    H_n    = logsumexp(z_n) - sum_v softmax(z_n)_v z_n,v                (entropy, optional)

and, without gradient, the statistics TRL's DPO/KTO metrics read (``STATS``): ``log_sum_sq_probs`` =
``log sum_v p_v^2`` (WPO weighting), ``mean_logits`` = ``mean_v z_n,v``, ``is_top1`` = ``argmax_v z_n,v == t_n``.

Rows are processed ``chunk_rows`` at a time: only one ``[chunk_rows, V]`` fp32 logits block lives at any moment, in
forward and in backward (the backward recomputes each block from the saved hidden rows instead of storing it).
The backward uses

    dlogp/dz = onehot(t) - p,      dH/dz = -p * (log p + H),      p = softmax(z)

then the chain rule through 1/T, the soft-cap (1 - tanh^2) and the scale, and finally
``grad_h = dL/dx @ W`` and ``grad_W = dL/dx^T @ h`` (accumulated in fp32, only when ``W`` requires grad, e.g. full
fine-tuning; skipped for LoRA where the head is frozen).

Everything is plain torch, so it runs on CPU and CUDA, in fp32, bf16 and fp16, with all softmax arithmetic in fp32.
The matmuls run in one *compute dtype*, fixed in the forward and reused by the backward (which autograd runs outside
the caller's autocast): the autocast dtype when autocast is on for the inputs' device (what ``F.linear`` would use
there), else the promotion of the hidden and weight dtypes (fp32 hidden with an fp16 head -> fp32).
"""

from __future__ import annotations

import math
from contextvars import ContextVar

import torch

from slimrl.compat.memory import free_bytes

# The most one fp32 logits block may take when the chunk size is chosen automatically: on a CPU small blocks stay in
# cache and cost nothing more; on a GPU each block re-reads the whole head from memory, so blocks of thousands of rows
# (880 at a 150K vocabulary) keep the passes over it few.
_AUTO_MAX_CHUNK_BYTES = {"cpu": 64 * 2**20, "cuda": 512 * 2**20}
_AUTO_MIN_ROWS = 16
# Non-differentiable per-row statistics the forward can also return (same names as TRL's fused head outputs).
STATS = ("log_sum_sq_probs", "mean_logits", "is_top1")
# At least this many automatic row chunks per call: `slimrl verify` sets it, since a tiny run's rows fit one chunk
# and a bug past the first would pass there (chunks are independent blocks, so only the order of sums changes)
MIN_CHUNKS: ContextVar[int] = ContextVar("slimrl_min_chunks", default=1)


def auto_chunk_rows(n_rows: int, vocab_size: int, device: torch.device, free: int | None = None) -> int:
    """Rows per chunk so that one fp32 ``[rows, V]`` block stays within a small share of free memory.

    Budget: ``min(cap, free / 32)`` per block (the backward keeps about three such blocks alive), at least 16 rows;
    the cap is 64 MiB on a CPU and 512 MiB on a GPU (:data:`_AUTO_MAX_CHUNK_BYTES`). ``free`` defaults to what is free
    now: ``torch.cuda.mem_get_info`` on CUDA, ``MemAvailable`` on CPU (a plan passes the GPU it plans for).
    """
    free = free_bytes(device) if free is None else free
    cap = _AUTO_MAX_CHUNK_BYTES.get(device.type, _AUTO_MAX_CHUNK_BYTES["cuda"])
    budget = min(cap, free // 32) if free else cap
    rows = max(_AUTO_MIN_ROWS, budget // (4 * vocab_size))
    return int(max(1, min(n_rows, rows)))


def rows_per_chunk(
    n_rows: int, vocab_size: int, device: torch.device, num_chunks: int = -1, multiplier: int | None = None
) -> int:
    """Translate ``unsloth_num_chunks`` (N >= 1: split the rows in N chunks; -1: automatic) to rows per chunk.

    ``multiplier`` (``unsloth_logit_chunk_multiplier``) divides the automatic chunk size: more, smaller blocks.
    """
    if num_chunks == -1 or num_chunks is None:
        rows = max(1, min(auto_chunk_rows(n_rows, vocab_size, device), -(-n_rows // MIN_CHUNKS.get())))
        return max(1, rows // multiplier) if multiplier else rows
    if not isinstance(num_chunks, int) or num_chunks < 1:
        raise ValueError(f"unsloth_num_chunks must be -1 (automatic) or an int >= 1, got {num_chunks!r}")
    return max(1, math.ceil(n_rows / num_chunks))


def compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The matmul dtype of the op: autocast's dtype when autocast is on for ``hidden``'s device, else the promotion
    of the two input dtypes."""
    device_type = hidden.device.type
    if device_type in ("cpu", "cuda", "xpu") and torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _logits(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scale: float,
    softcap: float | None,
    temperature: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 ``z = g(h W^T + b) / T`` for one chunk (``h``, ``weight``, ``bias`` already in the compute dtype, run
    with autocast off); also returns ``tanh`` (soft-cap) for the backward."""
    x = torch.nn.functional.linear(h, weight, bias).float()  # [R, V]
    if scale != 1.0:
        x.mul_(scale)
    tanh = None
    if softcap is not None:
        tanh = x.div_(softcap).tanh_()  # [R, V], in place
        x = tanh * softcap
    if temperature != 1.0:
        x.div_(temperature)
    return x, tanh


def autocast_off(device: torch.device):
    """Autocast disabled for ``device`` (the op casts explicitly to its compute dtype)."""
    from contextlib import nullcontext

    if device.type in ("cpu", "cuda", "xpu"):
        return torch.autocast(device.type, enabled=False)
    return nullcontext()


class ChunkedLogProb(torch.autograd.Function):
    """Autograd function behind :func:`chunked_logprobs`. Inputs: hidden ``[N, H]``, weight ``[V, H]``."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_rows, scale, softcap, with_entropy, stats=()):
        dtype = compute_dtype(hidden, weight)
        with autocast_off(hidden.device):
            return ChunkedLogProb._forward(
                ctx, dtype, hidden, weight, bias, targets, temperature, chunk_rows, scale, softcap, with_entropy, stats
            )

    @staticmethod
    def _forward(
        ctx, dtype, hidden, weight, bias, targets, temperature, chunk_rows, scale, softcap, with_entropy, stats
    ):
        n = hidden.size(0)
        w, b = weight.to(dtype), bias.to(dtype) if bias is not None else None  # no copy when already in dtype
        logps = hidden.new_empty(n, dtype=torch.float32)  # [N]
        logz = hidden.new_empty(n, dtype=torch.float32)  # [N]
        entropy = hidden.new_empty(n, dtype=torch.float32) if with_entropy else None  # [N]
        sq = hidden.new_empty(n, dtype=torch.float32) if "log_sum_sq_probs" in stats else None  # [N]
        mean = hidden.new_empty(n, dtype=torch.float32) if "mean_logits" in stats else None  # [N]
        top1 = hidden.new_empty(n, dtype=torch.bool) if "is_top1" in stats else None  # [N]
        for s in range(0, n, chunk_rows):
            e = min(n, s + chunk_rows)
            z, _ = _logits(hidden[s:e].to(dtype), w, b, scale, softcap, temperature)  # [R, V]
            lz = torch.logsumexp(z, dim=-1)  # [R]
            logz[s:e] = lz
            logps[s:e] = z.gather(1, targets[s:e, None]).squeeze(1) - lz
            if mean is not None:
                mean[s:e] = z.mean(-1)
            if top1 is not None:
                top1[s:e] = z.argmax(-1) == targets[s:e]  # first maximum, as torch.argmax and TRL's kernel
            if sq is not None:
                sq[s:e] = torch.logsumexp(2.0 * z, dim=-1) - 2.0 * lz  # log sum_v p_v^2
            if with_entropy:
                lp = z.sub_(lz[:, None])  # log-softmax in place of z: [R, V]
                entropy[s:e] = -(lp.exp() * lp).sum(-1)
            del z
        ctx.save_for_backward(hidden, weight, bias, targets, logz, entropy)
        ctx.cfg = (temperature, chunk_rows, scale, softcap, dtype)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(logz, *(x for x in (sq, mean, top1) if x is not None))
        return logps, entropy, sq, mean, top1

    @staticmethod
    def backward(ctx, grad_logps, grad_entropy, *_stats):
        with autocast_off(ctx.saved_tensors[0].device):
            return ChunkedLogProb._backward(ctx, grad_logps, grad_entropy)

    @staticmethod
    def _backward(ctx, grad_logps, grad_entropy):
        hidden, weight, bias, targets, logz, entropy = ctx.saved_tensors
        temperature, chunk_rows, scale, softcap, dtype = ctx.cfg
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        if grad_logps is None and grad_entropy is None:
            return (None,) * 10
        n = hidden.size(0)
        grad_h = torch.empty_like(hidden) if need_h else None  # [N, H]
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None  # [V, H]
        grad_b = torch.zeros(weight.size(0), dtype=torch.float32, device=weight.device) if need_b else None  # [V]
        w, b = weight.to(dtype), bias.to(dtype) if bias is not None else None
        for s in range(0, n, chunk_rows):
            e = min(n, s + chunk_rows)
            h = hidden[s:e].to(dtype)  # [R, H]
            z, tanh = _logits(h, w, b, scale, softcap, temperature)  # [R, V]
            lp = z.sub_(logz[s:e, None])  # log-softmax in place of z: [R, V]
            g = lp.exp()  # p, turned into dL/dz in place below: [R, V]
            if grad_entropy is not None:
                lp.add_(entropy[s:e, None]).mul_(g)  # p (log p + H): [R, V]
            gl = grad_logps[s:e, None] if grad_logps is not None else None  # [R, 1]
            if gl is not None:
                g.mul_(-gl)
                g.scatter_add_(1, targets[s:e, None], gl)
            else:
                g.zero_()
            if grad_entropy is not None:
                g.addcmul_(lp, grad_entropy[s:e, None], value=-1.0)
            del lp, z
            if temperature != 1.0:
                g.div_(temperature)
            if softcap is not None:
                g.mul_(1.0 - tanh * tanh)
            if scale != 1.0:
                g.mul_(scale)
            if need_h:
                grad_h[s:e] = (g.to(dtype) @ w).to(hidden.dtype)  # [R, H]
            if need_w:
                grad_w.addmm_(g.t(), h.float())
            if need_b:
                grad_b.add_(g.sum(0))
            del g, tanh
        grad_w = grad_w.to(weight.dtype) if grad_w is not None else None
        grad_b = grad_b.to(bias.dtype) if grad_b is not None else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None, None


def chunked_logprob_outputs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    *,
    outputs: tuple[str, ...] = ("log_probs",),
    chunk_rows: int | None = None,
    num_chunks: int = -1,
    chunk_multiplier: int | None = None,
    logit_scale: float = 1.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """:func:`chunked_logprobs` returning TRL's fused-head tuple in one pass over the rows.

    ``outputs`` names what to compute among ``"entropy"`` and :data:`STATS` (``log_probs`` always). Shapes:
    ``hidden [N, H]`` -> ``(log_probs [N], entropy [N], log_sum_sq_probs [N], mean_logits [N], is_top1 [N] bool)``,
    ``None`` for what was not asked. Only ``log_probs`` and ``entropy`` carry gradients. ``chunk_rows`` wins over
    ``num_chunks``; both unset -> automatic (``chunk_multiplier`` divides the automatic size).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.size(1) != weight.size(1):
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H]; got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"targets must be [N]={hidden.size(0)}, got {tuple(targets.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    stats = tuple(name for name in STATS if name in outputs)
    n = hidden.size(0)
    if n == 0:
        zero = (hidden.sum() * 0.0).float().expand(0)  # keep the graph connected for an all-masked batch
        return (
            zero,
            zero if "entropy" in outputs else None,
            *(
                hidden.new_empty(0, dtype=torch.bool if s == "is_top1" else torch.float32) if s in stats else None
                for s in STATS
            ),
        )
    rows = chunk_rows or rows_per_chunk(n, weight.size(0), hidden.device, num_chunks, chunk_multiplier)
    return ChunkedLogProb.apply(
        hidden,
        weight,
        bias,
        targets.long(),
        float(temperature),
        int(rows),
        float(logit_scale),
        softcap,
        "entropy" in outputs,
        stats,
    )


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    *,
    with_entropy: bool = False,
    **chunking,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row log-prob of ``targets`` (and entropy) under ``softmax(g(hidden @ weight.T + bias) / temperature)``.

    Shapes: ``hidden [N, H]``, ``weight [V, H]``, ``bias [V]``, ``targets [N]`` (long) -> ``logps [N]`` fp32 and
    ``entropy [N]`` fp32 or None. ``chunking``: ``chunk_rows``, ``num_chunks``, ``chunk_multiplier``,
    ``logit_scale``, ``softcap`` as in :func:`chunked_logprob_outputs`.
    """
    outputs = ("log_probs", "entropy") if with_entropy else ("log_probs",)
    logps, ent, *_ = chunked_logprob_outputs(hidden, weight, targets, bias, temperature, outputs=outputs, **chunking)
    return logps, ent


def masked_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`chunked_logprobs` on the positions where ``mask`` is true; zeros elsewhere.

    Shapes: ``hidden [B, T, H]``, ``targets [B, T]``, ``mask [B, T]`` (bool) -> ``logps [B, T]``, ``entropy [B, T]``.
    Only the masked-in rows are projected (prompt and padding positions cost nothing).
    """
    mask = mask.bool()
    rows = hidden[mask]  # [N_valid, H]
    logps, ent = chunked_logprobs(rows, weight, targets[mask], bias, temperature, **kwargs)

    def scatter(x: torch.Tensor | None) -> torch.Tensor | None:
        if x is None:
            return None
        return x.new_zeros(mask.shape).masked_scatter(mask, x)  # [B, T]

    return scatter(logps), scatter(ent)
