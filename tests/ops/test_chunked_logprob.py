"""slimrl.ops.chunked_logprob against an fp64 reference that materialises the full logits.

Tolerances: fp32 inputs are compared with an fp64 reference at rtol/atol 1e-5 (fp32 has ~7 significant digits;
log-softmax over V ~ 1e3 sums adds a few ulps), bf16 inputs at 3e-2 (bf16 has 8 mantissa bits; the matmul runs in
bf16, the softmax in fp32).
"""

from __future__ import annotations

import pytest
import torch

from slimrl.ops import chunked_logprobs, masked_token_logprobs, rows_per_chunk


def reference(hidden, weight, targets, bias=None, temperature=1.0, scale=1.0, softcap=None):
    """fp64 log-probs and entropy with the full [N, V] logits."""
    x = hidden.double() @ weight.double().T
    if bias is not None:
        x = x + bias.double()
    x = x * scale
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    z = x / temperature
    logp_all = torch.log_softmax(z, -1)
    logps = logp_all.gather(1, targets[:, None]).squeeze(1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps, entropy


def make(n=37, h=24, v=203, dtype=torch.float32, bias=False, weight_grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.5).to(dtype).requires_grad_(weight_grad)
    b = (torch.randn(v, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, b, targets


CASES = [
    # chunk_rows, temperature, bias, scale, softcap
    (1, 1.0, False, 1.0, None),  # one row per chunk
    (5, 0.7, False, 1.0, None),  # 37 rows not divisible by 5, V=203 not a power of two
    (8, 1.3, True, 1.0, None),
    (16, 0.9, False, 0.5, 30.0),  # Gemma-style soft-cap + Granite-style scale
    (100, 1.0, True, 2.0, None),  # one chunk bigger than N
]


@pytest.mark.parametrize("chunk_rows,temperature,use_bias,scale,softcap", CASES)
def test_values_and_gradients_match_fp64(chunk_rows, temperature, use_bias, scale, softcap):
    hidden, weight, bias, targets = make(bias=use_bias)
    logps, ent = chunked_logprobs(
        hidden,
        weight,
        targets,
        bias,
        temperature,
        chunk_rows=chunk_rows,
        logit_scale=scale,
        softcap=softcap,
        with_entropy=True,
    )
    ref_inputs = [t.detach().double().requires_grad_() for t in (hidden, weight)]
    ref_bias = bias.detach().double().requires_grad_() if bias is not None else None
    rl, re = reference(ref_inputs[0], ref_inputs[1], targets, ref_bias, temperature, scale, softcap)
    torch.testing.assert_close(logps.double(), rl, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), re, rtol=1e-5, atol=1e-5)

    # A loss that uses both outputs with non-trivial weights, so every backward term is exercised.
    w1 = torch.linspace(-1, 2, hidden.size(0))
    w2 = torch.linspace(0.5, -0.3, hidden.size(0))
    ((logps * w1).sum() + (ent * w2).sum()).backward()
    ((rl * w1.double()).sum() + (re * w2.double()).sum()).backward()
    torch.testing.assert_close(hidden.grad.double(), ref_inputs[0].grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad.double(), ref_inputs[1].grad, rtol=1e-5, atol=1e-5)
    if bias is not None:
        torch.testing.assert_close(bias.grad.double(), ref_bias.grad, rtol=1e-5, atol=1e-5)


def test_logps_only_and_entropy_only_gradients():
    hidden, weight, _, targets = make(weight_grad=False)
    logps, ent = chunked_logprobs(hidden, weight, targets, chunk_rows=7, with_entropy=True)
    ent.sum().backward()  # logps unused: its grad arrives as None
    h64 = hidden.detach().double().requires_grad_()
    _, re = reference(h64, weight.detach(), targets)
    re.sum().backward()
    torch.testing.assert_close(hidden.grad.double(), h64.grad, rtol=1e-5, atol=1e-5)
    assert weight.grad is None  # frozen head (LoRA): no [V, H] gradient is built


def test_bf16_against_fp64():
    hidden, weight, _, targets = make(dtype=torch.bfloat16)
    logps, ent = chunked_logprobs(hidden, weight, targets, chunk_rows=6, temperature=0.8, with_entropy=True)
    assert logps.dtype == torch.float32 and ent.dtype == torch.float32
    rl, re = reference(hidden.detach(), weight.detach(), targets, temperature=0.8)
    torch.testing.assert_close(logps.double(), rl, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(ent.double(), re, rtol=3e-2, atol=3e-2)
    logps.sum().backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16
    h64 = hidden.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    reference(h64, w64, targets, temperature=0.8)[0].sum().backward()
    torch.testing.assert_close(hidden.grad.double(), h64.grad, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(weight.grad.double(), w64.grad, rtol=3e-2, atol=3e-2)


def test_masked_positions_are_zero_and_never_projected():
    hidden, weight, _, _ = make(n=12)
    hidden3 = hidden.detach().view(3, 4, -1).requires_grad_()  # [B=3, T=4, H]
    targets = torch.randint(0, weight.size(0), (3, 4))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    logps, ent = masked_token_logprobs(hidden3, weight.detach(), targets, mask, with_entropy=True, chunk_rows=3)
    assert logps.shape == (3, 4) and ent.shape == (3, 4)
    assert torch.all(logps[~mask] == 0) and torch.all(ent[~mask] == 0)
    rl, _ = reference(hidden3.detach().reshape(12, -1), weight.detach(), targets.reshape(-1))
    torch.testing.assert_close(logps[mask].double(), rl.view(3, 4)[mask], rtol=1e-5, atol=1e-5)
    logps.sum().backward()
    assert torch.all(hidden3.grad[~mask] == 0)


def test_all_masked_batch_keeps_graph():
    hidden, weight, _, targets = make(n=4)
    mask = torch.zeros(2, 2, dtype=torch.bool)
    logps, _ = masked_token_logprobs(hidden.view(2, 2, -1), weight, targets.view(2, 2), mask)
    logps.sum().backward()  # must not raise
    assert torch.all(hidden.grad == 0)


def test_no_full_logits_in_memory():
    """With 4-row chunks the largest fp32 block in forward/backward is [4, V], never [N, V]."""
    hidden, weight, _, targets = make(n=64, v=5000)
    biggest = []

    def pack(t):
        biggest.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logps, _ = chunked_logprobs(hidden, weight, targets, chunk_rows=4)
    # saved for backward: hidden, weight, targets, logz - nothing of size N x V
    assert max(biggest) <= weight.numel()
    assert all(n < 64 * 5000 for n in biggest if n != weight.numel())
    logps.sum().backward()


def test_rows_per_chunk():
    cpu = torch.device("cpu")
    assert rows_per_chunk(100, 1000, cpu, num_chunks=4) == 25
    assert rows_per_chunk(101, 1000, cpu, num_chunks=4) == 26
    assert 1 <= rows_per_chunk(10_000, 49_152, cpu, num_chunks=-1) <= 10_000
    with pytest.raises(ValueError, match="unsloth_num_chunks"):
        rows_per_chunk(10, 10, cpu, num_chunks=0)


def test_bad_shapes_raise():
    hidden, weight, _, targets = make()
    with pytest.raises(ValueError, match="hidden must be"):
        chunked_logprobs(hidden[:, :5], weight, targets)
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs(hidden, weight, targets, temperature=0.0)


@pytest.mark.parametrize("chunk_rows,temperature,use_bias,scale,softcap", CASES)
def test_stats_outputs_match_fp64(chunk_rows, temperature, use_bias, scale, softcap):
    """log_sum_sq_probs, mean_logits, is_top1 (TRL's fused-head metrics) against the full fp64 logits."""
    from slimrl.ops.chunked_logprob import chunked_logprob_outputs

    hidden, weight, bias, targets = make(bias=use_bias)
    targets[:5] = 0
    weight.data[0] = hidden.data[:5].mean(0) * 4  # row 0 of the head aligned with rows 0..4: vocab 0 is their argmax
    z = (hidden.double() @ weight.double().T + (bias.double() if bias is not None else 0.0)) * scale  # [N, V]
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    ref_logp = torch.log_softmax(z, -1)
    logps, ent, sq, mean, top1 = chunked_logprob_outputs(
        hidden,
        weight,
        targets,
        bias,
        temperature,
        chunk_rows=chunk_rows,
        logit_scale=scale,
        softcap=softcap,
        outputs=("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1"),
    )
    torch.testing.assert_close(logps.double(), ref_logp.gather(1, targets[:, None]).squeeze(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent.double(), -(ref_logp.exp() * ref_logp).sum(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sq.double(), torch.logsumexp(2 * ref_logp, -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean.double(), z.mean(-1), rtol=1e-5, atol=1e-5)
    assert torch.equal(top1, z.argmax(-1) == targets)
    assert top1.any() and not top1.all(), "the case must contain both top-1 and non-top-1 targets"
    assert not (sq.requires_grad or mean.requires_grad or top1.requires_grad)
    # Only log-probs and entropy take gradients, and they match the plain function's.
    (logps.sum() + ent.sum()).backward()
    g = hidden.grad.clone()
    hidden.grad = None
    lp2, ent2 = chunked_logprobs(
        hidden,
        weight,
        targets,
        bias,
        temperature,
        chunk_rows=chunk_rows,
        logit_scale=scale,
        softcap=softcap,
        with_entropy=True,
    )
    (lp2.sum() + ent2.sum()).backward()
    torch.testing.assert_close(hidden.grad, g, rtol=0, atol=0)


def test_chunk_multiplier_divides_the_automatic_size():
    dev = torch.device("cpu")
    auto = rows_per_chunk(10_000, 49_152, dev)
    assert rows_per_chunk(10_000, 49_152, dev, multiplier=4) == max(1, auto // 4)
    assert rows_per_chunk(100, 49_152, dev, num_chunks=4, multiplier=4) == 25  # explicit N ignores it


# Mixed precision: the op fixes one compute dtype in the forward (autocast's, else the promotion of the two input
# dtypes) and reuses it in the backward, which autograd runs outside the caller's autocast. Tolerance by compute dtype:
# fp32 1e-5 (as above); bf16 5e-2 and fp16 1e-2 (the inputs are rounded to 8 / 11 mantissa bits before the matmul;
# logits here are O(3), so their rounding error is ~1e-2 / ~2e-3; softmax stays fp32).
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TOL = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 1e-2}


@pytest.mark.parametrize("autocast", [None, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden_dtype", DTYPES)
@pytest.mark.parametrize("weight_dtype", DTYPES)
def test_every_dtype_pair_under_autocast_on_and_off(hidden_dtype, weight_dtype, autocast):
    from contextlib import nullcontext

    from slimrl.ops.chunked_logprob import compute_dtype

    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(19, 24, generator=g).to(hidden_dtype).requires_grad_()
    weight = (torch.randn(101, 24, generator=g) * 0.5).to(weight_dtype).requires_grad_()
    targets = torch.randint(0, 101, (19,), generator=g)
    ctx = torch.autocast("cpu", dtype=autocast) if autocast is not None else nullcontext()
    with ctx:
        dtype = compute_dtype(hidden, weight)
        logps, ent = chunked_logprobs(hidden, weight, targets, None, 0.9, chunk_rows=4, with_entropy=True)
    expected = autocast or torch.promote_types(hidden_dtype, weight_dtype)
    assert dtype == expected and logps.dtype == torch.float32
    w1 = torch.linspace(-1, 2, 19)
    ((logps * w1).sum() + ent.sum()).backward()  # outside autocast, as autograd runs it
    assert hidden.grad.dtype == hidden_dtype and weight.grad.dtype == weight_dtype

    # fp64 reference on the inputs as the op sees them (rounded to the compute dtype)
    h64 = hidden.detach().to(dtype).double().requires_grad_()
    w64 = weight.detach().to(dtype).double().requires_grad_()
    rl, re = reference(h64, w64, targets, temperature=0.9)
    ((rl * w1.double()).sum() + re.sum()).backward()
    tol = TOL[dtype]
    torch.testing.assert_close(logps.double(), rl, rtol=tol, atol=tol)
    torch.testing.assert_close(ent.double(), re, rtol=tol, atol=tol)
    grad_tol = max(tol, TOL[hidden_dtype], TOL[weight_dtype])  # the gradients are stored in the inputs' dtypes
    torch.testing.assert_close(hidden.grad.double(), h64.grad, rtol=grad_tol, atol=grad_tol)
    torch.testing.assert_close(weight.grad.double(), w64.grad, rtol=grad_tol, atol=grad_tol)
