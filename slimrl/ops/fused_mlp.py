"""A gated MLP with LoRA on its three projections as one autograd Function.

``mlp(x) = down(act(gate(x)) * up(x))`` (SwiGLU with ``act = silu``: Shazeer 2020, arXiv:2002.05202; GeGLU with
Gemma's tanh GELU), each projection ``base(x) + s * dropout(x) @ A^T @ B^T`` (:mod:`slimrl.ops.lora_linear`).
Through PEFT's layers autograd keeps, per layer: fp32 copies of ``x`` (twice) and of the product (where the adapters
are fp32), ``gate(x)``, ``act(gate(x))``, ``up(x)``, the product and the low-rank intermediates. This Function keeps
``x``, ``g = gate(x)`` and ``u = up(x)`` (plus the ``[N, r]`` low-rank products and any dropout masks as booleans)
and recomputes ``act(g)`` and the product in the backward. Gate's and up's adapters read ``x`` once (their ``A``
stacked, one GEMM) where no dropout separates their inputs.

Backward, for the output gradient ``o`` (``[N, H]``) and the product ``m = act(g) * u``:
``dm = o Wd + dropout'(s_d (o B_d) A_d)``; ``du = dm * act(g)``; ``dg = act'(g) * dm * u`` (autograd through the
module's own activation on ``g``, so any position-wise activation is served exactly); each adapter's gradients as in
:mod:`slimrl.ops.lora_linear`; ``dx = dg Wg + du Wu`` plus the two adapters' input gradients. The base weights are
frozen: they get no gradient. A 4-bit base is dequantised per GEMM, as bitsandbytes' own matmul does.

Dropout masks are drawn in PEFT's order (gate's input, up's input, the product) and as PEFT draws them on a CPU.
The bases compute in the activation's dtype (autocast's where it is on), the adapters in the dtype PEFT computes
them in, each product added into its base output as :mod:`slimrl.ops.lora_linear` adds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from slimrl.ops.lora_linear import (
    adapter_dtype,
    adapter_input,
    adapter_input_grad,
    add_product,
    compute_dtype,
    dropout_mask,
    outside_autocast,
    product_grads,
)


@dataclass(frozen=True)
class Projection:
    """One frozen base projection: its own forward (``x [N, in] -> [N, out]``, bias included: a 4-bit base runs
    bitsandbytes' kernel, the numbers PEFT's path gets), its dense weight ``[out, in]`` in a dtype for the backward
    (4-bit: dequantised), and its adapter's scale."""

    base: Callable[[torch.Tensor], torch.Tensor]
    weight: Callable[[torch.dtype], torch.Tensor]
    scale: float


@dataclass(frozen=True)
class GatedSpec:
    """What the Function needs beside the tensors autograd differentiates."""

    gate: Projection
    up: Projection
    down: Projection
    act: Callable[[torch.Tensor], torch.Tensor]
    p: float
    training: bool


SMALL = 1 << 22  # elements of [N, I] below which the product runs whole (a chunk would only add launches)


def row_chunks(rows: int, inter: int, hidden: int) -> list[slice]:
    """Row slices over which the product ``act(g) * u`` and its gradients run: ``ceil(I / H)`` of them, so that each
    ``[rows, I]`` temporary is no larger than the layer's input ``[N, H]`` (one slice for small inputs)."""
    count = 1 if rows * inter < SMALL else min(rows, -(-inter // hidden))
    step = -(-rows // count)
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def _part(mask: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if mask is None else mask[rows]


class GatedLoraMLP(torch.autograd.Function):
    """The gated MLP with LoRA projections on 2-D ``x [N, H]``, the adapters' products in ``dt`` (module
    docstring)."""

    @staticmethod
    def forward(ctx, x, a_g, b_g, a_u, b_u, a_d, b_d, spec, dt):  # noqa: ANN001, ANN205 - autograd's signature
        p, training, ad = spec.p, spec.training, a_g.dtype
        m_g, m_u = dropout_mask(x, p, training, ad), dropout_mask(x, p, training, ad)
        if m_g is None:  # one read of x for both adapters
            h_gu = x.to(dt) @ torch.cat([a_g, a_u]).to(dt).t()  # [N, 2r]
            h_g, h_u = h_gu.split([a_g.shape[0], a_u.shape[0]], dim=1)
        else:
            h_g = adapter_input(x, m_g, p, ad, dt) @ a_g.to(dt).t()  # [N, r]
            h_u = adapter_input(x, m_u, p, ad, dt) @ a_u.to(dt).t()  # [N, r]
        g = add_product(spec.gate.base(x), h_g, b_g, spec.gate.scale)  # [N, I]
        u = add_product(spec.up.base(x), h_u, b_u, spec.up.scale)  # [N, I]
        m_d = dropout_mask(g, p, training, ad)  # drawn whole, as PEFT draws it on the product
        h_d = torch.empty(x.shape[0], a_d.shape[0], dtype=dt, device=x.device)  # [N, r]
        out = None
        for rows in row_chunks(*g.shape, x.shape[1]):
            m = spec.act(g[rows]) * u[rows]  # [n, I]
            h_d[rows] = adapter_input(m, _part(m_d, rows), p, ad, dt) @ a_d.to(dt).t()
            part = add_product(spec.down.base(m), h_d[rows], b_d, spec.down.scale)  # [n, H]
            if out is None:
                out = part if rows.stop == x.shape[0] else part.new_empty(x.shape[0], part.shape[1])
            if out is not part:
                out[rows] = part
        ctx.save_for_backward(x, g, u, h_g, h_u, h_d, m_g, m_u, m_d, a_g, b_g, a_u, b_u, a_d, b_d)
        ctx.spec, ctx.dt = spec, dt
        return out

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        x, g, u, h_g, h_u, h_d, m_g, m_u, m_d, a_g, b_g, a_u, b_u, a_d, b_d = ctx.saved_tensors
        spec, dt = ctx.spec, ctx.dt
        bd = g.dtype  # the bases' dtype
        o = grad.to(bd)  # [N, H]
        chunks = row_chunks(*g.shape, x.shape[1])
        grad_x = o.new_empty(x.shape) if len(chunks) > 1 else None  # [N, H]
        sums: list = [None] * 6  # the adapters' gradients, summed over the chunks in fp32
        for rows in chunks:
            parts = _chunk_backward(
                spec, dt, o[rows], x[rows], g[rows], u[rows], (h_g[rows], h_u[rows], h_d[rows]),
                (_part(m_g, rows), _part(m_u, rows), _part(m_d, rows)), (a_g, b_g, a_u, b_u, a_d, b_d),
            )  # fmt: skip
            if grad_x is None:
                grad_x = parts[0]
            else:
                grad_x[rows] = parts[0]
            sums = [w.float() if acc is None else acc.add_(w) for acc, w in zip(sums, parts[1:], strict=True)]
        adapters = (a_g, b_g, a_u, b_u, a_d, b_d)
        return (grad_x.to(x.dtype), *(w.to(a.dtype) for w, a in zip(sums, adapters, strict=True)), None, None)


def _chunk_backward(spec: GatedSpec, dt: torch.dtype, o, x, g, u, hs, masks, adapters) -> tuple:  # noqa: ANN001
    """The input gradient and the six adapter gradients of one chunk of rows (module docstring)."""
    (h_g, h_u, h_d), (m_g, m_u, m_d), (a_g, b_g, a_u, b_u, a_d, b_d) = hs, masks, adapters
    p, ad, bd = spec.p, a_g.dtype, g.dtype
    grad_hd, grad_bd = product_grads(o, spec.down.scale, h_d, b_d)  # [n, r], [H, r]
    with torch.enable_grad():
        g_leaf = g.detach().requires_grad_()
        act = spec.act(g_leaf)  # [n, I]
    m = act.detach() * u  # [n, I]
    grad_ad = grad_hd.t() @ adapter_input(m, m_d, p, ad, dt)  # [r, I]
    del m
    grad_m = o @ spec.down.weight(bd)  # [n, I]
    grad_m.add_(adapter_input_grad(grad_hd @ a_d.to(dt), m_d, p, ad, bd))
    grad_u = grad_m * act.detach()  # [n, I]
    (grad_g,) = torch.autograd.grad(act, g_leaf, grad_m.mul_(u))  # [n, I]
    del act, grad_m
    grad_hg, grad_bg = product_grads(grad_g, spec.gate.scale, h_g, b_g)  # [n, r], [I, r]
    grad_hu, grad_bu = product_grads(grad_u, spec.up.scale, h_u, b_u)
    grad_x = grad_g @ spec.gate.weight(bd)  # [n, H]
    grad_x.add_(grad_u @ spec.up.weight(bd))
    del grad_g, grad_u
    if m_g is None:  # both adapters' gradients from one read of x
        grad_h = torch.cat([grad_hg, grad_hu], dim=1)  # [n, 2r]
        grad_a = grad_h.t() @ x.to(dt)  # [2r, H]
        grad_ag, grad_au = grad_a.split([a_g.shape[0], a_u.shape[0]])
        grad_x.add_((grad_h @ torch.cat([a_g, a_u]).to(dt)).to(bd))
    else:
        grad_ag = grad_hg.t() @ adapter_input(x, m_g, p, ad, dt)  # [r, H]
        grad_au = grad_hu.t() @ adapter_input(x, m_u, p, ad, dt)  # [r, H]
        grad_x.add_(adapter_input_grad(grad_hg @ a_g.to(dt), m_g, p, ad, bd))
        grad_x.add_(adapter_input_grad(grad_hu @ a_u.to(dt), m_u, p, ad, bd))
    return grad_x, grad_ag, grad_bg, grad_au, grad_bu, grad_ad, grad_bd


def gated_lora_mlp(
    x: torch.Tensor,
    adapters: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    spec: GatedSpec,
) -> torch.Tensor:
    """The gated MLP of ``x [..., H]`` with ``adapters`` = (A_gate, B_gate, A_up, B_up, A_down, B_down): the bases
    in :func:`compute_dtype`, the adapters in :func:`adapter_dtype`; the result ``[..., H]`` in the bases' dtype."""
    dt = adapter_dtype(x, adapters[0])
    flat = x.reshape(-1, x.shape[-1]).to(compute_dtype(x))  # [N, H]
    with outside_autocast(x):
        out = GatedLoraMLP.apply(flat, *adapters, spec, dt)
    return out.reshape(*x.shape[:-1], out.shape[-1])
