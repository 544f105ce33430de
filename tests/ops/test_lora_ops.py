"""slimrl's LoRA ops against their formulas in fp64 autograd: ``lora_add`` (:mod:`slimrl.ops.lora_linear`) and the
gated MLP with LoRA projections (:mod:`slimrl.ops.fused_mlp`).

Tolerance (relative, ``||ours - ref|| / ||ref||``): 1e-6 in fp32 (one layer's sums in another order; fp32's epsilon is
1.2e-7); in bf16 (epsilon 3.9e-3) 1e-2 for one projection, 2e-2 for the MLP (three GEMMs and the product deep). With
dropout the reference applies the same masks (drawn from the same seed as ``torch.nn.functional.dropout`` draws them).
"""

from __future__ import annotations

import pytest
import torch

from slimrl.ops.fused_mlp import GatedSpec, Projection, gated_lora_mlp
from slimrl.ops.lora_linear import lora_add

N, IN, OUT, R, S = 24, 16, 12, 4, 2.0


def _rel(ours, ref) -> float:
    return ((ours.double() - ref).norm() / ref.norm()).item()


def _leaves(*shapes, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype).requires_grad_() for s in shapes]


def _grads(out, inputs, grad):
    return torch.autograd.grad(out, inputs, grad.to(out.dtype))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("S", [2.0, 0.3])  # a power of two moves onto B; another scales the product
def test_lora_add_is_its_formula(dtype, tol, p, S):
    x, a, b = _leaves((2, N // 2, IN), (R, IN), (OUT, R), dtype=dtype)
    w = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    grad = torch.randn(2, N // 2, OUT, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    a32, b32 = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()  # fp32 adapters, as PEFT's
    torch.manual_seed(7)
    y = x @ w.to(dtype).t()
    out = lora_add(y, x, a32, b32, S, p, training=True)
    torch.manual_seed(7)
    mask = torch.nn.functional.dropout(torch.ones_like(x), p, training=True).double()  # the masks, scaled
    x64, a64, b64 = (t.detach().double().requires_grad_() for t in (x, a, b))
    ref = x64 @ w.t() + S * ((x64 * mask) @ a64.t()) @ b64.t()
    assert out.dtype == dtype and out.shape == ref.shape
    assert _rel(out, ref.detach()) < tol
    for ours, theirs in zip(_grads(out, (x, a32, b32), grad), _grads(ref, (x64, a64, b64), grad), strict=True):
        assert _rel(ours, theirs) < tol


ACTS = {"silu": torch.nn.SiLU(), "gelu_tanh": torch.nn.GELU(approximate="tanh")}


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])
def test_the_gated_mlp_is_its_formula(act, dtype, tol, p, chunked, monkeypatch):
    from slimrl.ops import fused_mlp

    if chunked:  # the product and its gradients in ceil(I / H) = 2 row chunks, as on a long input
        monkeypatch.setattr(fused_mlp, "SMALL", 0)
        assert len(fused_mlp.row_chunks(N, 2 * IN, IN)) == 2
    hidden, inter = IN, 2 * IN
    x, ag, bg, au, bu, ad, bd = _leaves(
        (2, N // 2, hidden), (R, hidden), (inter, R), (R, hidden), (inter, R), (R, inter), (hidden, R), dtype=dtype
    )
    gen = torch.Generator().manual_seed(1)
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    wg, wu, wd = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes)
    bias = torch.randn(inter, generator=gen, dtype=torch.float64)  # a biased gate (Llama's mlp_bias=True)
    grad = torch.randn(2, N // 2, hidden, generator=gen, dtype=torch.float64)
    adapters = [t.detach().float().requires_grad_() for t in (ag, bg, au, bu, ad, bd)]

    def base(w, b=None):
        return lambda t: torch.nn.functional.linear(t, w.to(t.dtype), None if b is None else b.to(t.dtype))

    spec = GatedSpec(
        Projection(base(wg, bias), lambda d: wg.to(d), S),
        Projection(base(wu), lambda d: wu.to(d), 0.5),
        Projection(base(wd), lambda d: wd.to(d), 1.0),
        act=ACTS[act],
        p=p,
        training=True,
    )
    torch.manual_seed(7)
    out = gated_lora_mlp(x, tuple(adapters), spec)
    torch.manual_seed(7)  # the three masks in PEFT's order: gate's input, up's input, the product
    masks = [torch.nn.functional.dropout(torch.ones(2, N // 2, n), p, training=True).double() for n in (hidden,) * 2]
    leaves = [t.detach().double().requires_grad_() for t in (x, ag, bg, au, bu, ad, bd)]
    x64, ag64, bg64, au64, bu64, ad64, bd64 = leaves
    g = x64 @ wg.t() + bias + S * ((x64 * masks[0]) @ ag64.t()) @ bg64.t()
    u = x64 @ wu.t() + 0.5 * ((x64 * masks[1]) @ au64.t()) @ bu64.t()
    m = ACTS[act](g) * u
    masks.append(torch.nn.functional.dropout(torch.ones(2, N // 2, inter), p, training=True).double())
    ref = m @ wd.t() + 1.0 * ((m * masks[2]) @ ad64.t()) @ bd64.t()
    assert out.dtype == dtype and _rel(out, ref.detach()) < tol
    for ours, theirs in zip(_grads(out, (x, *adapters), grad), _grads(ref, leaves, grad), strict=True):
        assert _rel(ours, theirs) < tol


def test_autocast_computes_in_its_dtype():
    x, a, b = _leaves((N, IN), (R, IN), (OUT, R))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, torch.randn(OUT, IN))
        out = lora_add(y, x, a, b, S)
    assert y.dtype == out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad.dtype == a.grad.dtype == torch.float32


def test_the_product_runs_in_chunks_no_larger_than_the_layer_input():
    from slimrl.ops.fused_mlp import row_chunks

    rows, inter, hidden = 33024, 8960, 1536  # Qwen2.5-1.5B, 8 completions of 4,096 after a 256-token prompt
    chunks = row_chunks(rows, inter, hidden)
    assert len(chunks) == 6 and chunks[0].start == 0 and chunks[-1].stop == rows
    assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:], strict=False))
    assert max(c.stop - c.start for c in chunks) * inter <= rows * hidden * 1.001
    assert row_chunks(64, 128, 32) == [slice(0, 64)]  # small: whole
