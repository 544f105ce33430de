"""LoRA added into a projection's output, in the activation's dtype (LoRA: Hu et al. 2021, arXiv:2106.09685).

A LoRA projection computes ``y = base(x) + s * dropout(x) @ A^T @ B^T`` (``A: [r, in]``, ``B: [out, r]``,
``s = lora_alpha / r``, or ``/ sqrt(r)`` with rsLoRA). PEFT's layer casts ``x`` to the adapter's dtype first (fp32
adapters beside a bf16 base: an fp32 copy of every activation), computes ``B(A(x))`` as a new ``[N, out]`` tensor,
scales it (another), adds it to the base output (another) and casts the sum back. Here the small ``A`` and ``B``
are computed in the dtype PEFT's path computes them in (autocast's where it is on: the bf16 of a mixed-precision
run, with no fp32 copy of the activation made or saved; else the adapter's own), and the scaled product is added
into the base output with PEFT's roundings in PEFT's order (``B h`` rounded, times ``s``, added in the wider dtype,
cast back; a power-of-two ``s`` is moved onto the small ``B``, where it rounds the same): under autocast the numbers
are PEFT's bit for bit, so slimrl's run and TRL's do not part
here (a 16-bit model amplifies a one-ulp difference in a projection into percents of a gradient). Nothing is saved
but ``x`` (which the base saves too), a dropout mask as booleans and ``h``.

Backward, with ``h = xd @ A^T`` (``[N, r]``, saved) and ``g`` the output gradient:
``dB = (s g)^T h``, ``dh = (s g) B``, ``dA = dh^T xd``, ``dx = dh A`` (times the dropout mask over ``1 - p``); the
base's own input gradient reaches ``x`` through its autograd. Saved: ``x`` (which the base saves too: the same
tensor), the dropout mask as booleans, ``h``.

Dropout draws its mask as ``torch.nn.functional.dropout`` does on a CPU (``bernoulli_(1 - p)`` on a tensor like
``x`` in the adapter's dtype, scaled by ``1 / (1 - p)``, applied in that dtype as PEFT applies it), so a CPU run
draws PEFT's masks from the same seed.
"""

from __future__ import annotations

import contextlib
import math

import torch


def dropout_mask(x: torch.Tensor, p: float, training: bool, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """The kept positions of a tensor like ``x`` (in ``dtype``, default ``x``'s) under dropout ``p`` as booleans
    (None: no dropout), drawn as ``torch.nn.functional.dropout`` draws them on a CPU."""
    if not training or p == 0.0:
        return None
    return torch.empty_like(x, dtype=dtype).bernoulli_(1.0 - p).bool()  # [N, in]


def dropped(x: torch.Tensor, mask: torch.Tensor | None, p: float) -> torch.Tensor:
    """``x`` with dropout's ``mask`` applied and the kept values scaled by ``1 / (1 - p)``."""
    if mask is None:
        return x
    return x * (mask.to(x.dtype) / (1.0 - p))


def autocast_dtype(x: torch.Tensor) -> torch.dtype | None:
    """Autocast's dtype where it is on for ``x``'s device, else None (a device autocast does not know: meta)."""
    kind = x.device.type
    try:
        return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    except RuntimeError:
        return None


def outside_autocast(x: torch.Tensor) -> contextlib.AbstractContextManager:
    """A block in which autocast is off for ``x``'s device: the op casts what it computes itself."""
    return torch.autocast(x.device.type, enabled=False) if autocast_dtype(x) is not None else contextlib.nullcontext()


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a base linear layer computes ``x`` in: autocast's where it is on for ``x``'s device, else ``x``'s."""
    return autocast_dtype(x) or x.dtype


def adapter_dtype(x: torch.Tensor, lora_a: torch.Tensor) -> torch.dtype:
    """The dtype PEFT computes an adapter's product in: autocast's where it is on, else the adapter's own (PEFT
    casts the input to it)."""
    return autocast_dtype(x) or lora_a.dtype


def adapter_input(x: torch.Tensor, mask: torch.Tensor | None, p: float, adapter: torch.dtype, dt: torch.dtype):
    """``dropout(x)`` as ``lora_A`` receives it in ``dt``: dropout applied in the adapter's dtype (PEFT casts first)."""
    return x.to(dt) if mask is None else dropped(x.to(adapter), mask, p).to(dt)


def adapter_input_grad(grad: torch.Tensor, mask: torch.Tensor | None, p: float, adapter: torch.dtype, dtype):
    """The gradient of ``x`` (in ``dtype``) from the gradient of :func:`adapter_input`'s result."""
    return grad.to(dtype) if mask is None else dropped(grad.to(adapter), mask, p).to(dtype)


def exact_scale(scale: float) -> bool:
    """Whether multiplying by ``scale`` commutes with rounding (a power of two: ``lora_alpha = r`` gives 1), so it
    can move onto the small ``B`` (or a ``[out, r]`` gradient) and give PEFT's numbers without a pass over
    ``[N, out]``."""
    mantissa, _ = math.frexp(scale)
    return scale > 0 and mantissa == 0.5


def add_product(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, scale: float) -> torch.Tensor:
    """``y + (h @ B^T) * scale`` in ``y``'s dtype, rounded as PEFT's layer rounds it: the product in ``h``'s dtype,
    scaled there, added in the wider of the two dtypes, cast back."""
    b = lora_b.to(h.dtype)  # [out, r]
    if exact_scale(scale):
        delta = h @ (b * scale).t()  # [N, out]
    else:
        delta = (h @ b.t()).mul_(scale)  # [N, out]
    wide = torch.promote_types(y.dtype, delta.dtype)
    return delta.to(wide).add_(y.to(wide)).to(y.dtype)


def product_grads(grad: torch.Tensor, scale: float, h: torch.Tensor, lora_b: torch.Tensor) -> tuple:
    """(the gradient of ``h``, ``B``'s gradient) of :func:`add_product` for its output gradient ``grad``, in ``h``'s
    dtype, rounded as autograd rounds PEFT's (the gradient scaled first)."""
    b = lora_b.to(h.dtype)  # [out, r]
    g = grad.to(h.dtype)  # [N, out]
    if exact_scale(scale):
        return g @ (b * scale), (g.t() @ h).mul_(scale)
    g = g * scale
    return g @ b, g.t() @ h


class LoraAdd(torch.autograd.Function):
    """``y + s * dropout(x) @ A^T @ B^T`` on 2-D ``y [N, out]`` and ``x [N, in]``, the product in ``dt`` (module
    docstring)."""

    @staticmethod
    def forward(ctx, y, x, lora_a, lora_b, scale, p, training, dt):  # noqa: ANN001, ANN205 - autograd's signature
        mask = dropout_mask(x, p, training, lora_a.dtype)
        h = adapter_input(x, mask, p, lora_a.dtype, dt) @ lora_a.to(dt).t()  # [N, r]
        ctx.save_for_backward(x, mask, h, lora_a, lora_b)
        ctx.scale, ctx.p, ctx.dt = scale, p, dt
        return add_product(y, h, lora_b, scale)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001, ANN205
        x, mask, h, lora_a, lora_b = ctx.saved_tensors
        dt, p = ctx.dt, ctx.p
        grad_h, grad_b = product_grads(grad, ctx.scale, h, lora_b)  # [N, r], [out, r]
        grad_a = grad_h.t() @ adapter_input(x, mask, p, lora_a.dtype, dt)  # [r, in]
        grad_x = adapter_input_grad(grad_h @ lora_a.to(dt), mask, p, lora_a.dtype, x.dtype)  # [N, in]
        return grad, grad_x, grad_a.to(lora_a.dtype), grad_b.to(lora_b.dtype), None, None, None, None


def lora_add(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scale: float,
    p: float = 0.0,
    training: bool = False,
) -> torch.Tensor:
    """``y + scale * dropout_p(x) @ lora_a^T @ lora_b^T`` for ``x [..., in]`` and the base output ``y [..., out]``
    (dropout only while ``training``), the product in :func:`adapter_dtype`; the result in ``y``'s dtype and shape."""
    dt = adapter_dtype(x, lora_a)
    with outside_autocast(x):
        out = LoraAdd.apply(
            y.reshape(-1, y.shape[-1]), x.reshape(-1, x.shape[-1]), lora_a, lora_b, scale, p, training, dt
        )  # [N, out]
    return out.reshape(*y.shape[:-1], y.shape[-1])
