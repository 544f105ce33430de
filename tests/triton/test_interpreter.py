"""TRL's Triton fused-head kernel, run on this CPU by Triton's interpreter (``TRITON_INTERPRET=1``).

On CUDA with Triton, slimrl hands DPO/KTO/SFT/RLOO's fused-head calls back to TRL's Triton kernel
(``trl.kernels.chunked_logprob``) unless the config sets slimrl's chunking. That path cannot run on a CPU, so it is
exercised here under the interpreter, which runs the same ``@triton.jit`` kernels with numpy: the test makes the
CPU count as a Triton device (what ``_use_triton`` answers on CUDA) and checks

1. the Triton kernels themselves (forward fold and backward) against an fp64 reference with the full logits and
   against slimrl's torch op (:func:`slimrl.ops.chunked_logprob.chunked_logprob_outputs`), values and gradients;
2. slimrl's routing on a Triton device: a patched DPO step hands every call back to TRL's Triton kernel (slimrl's
   kernel serves none) and equals TRL alone; with ``unsloth_num_chunks`` set, slimrl's kernel serves instead and
   the Triton kernel is not called, same loss and gradients.

Tolerances: fp32 throughout. Kernel vs fp64: 1e-5 relative/absolute (the kernel sums exp over 1024-wide blocks in
fp32; V ~ 3e3 terms add a few ulps, as for slimrl's op in tests/ops/test_chunked_logprob.py). Patched vs unpatched:
1e-4 relative, the repository's parity tolerance (tests/patching/parity.py: the same math summed in other groupings).

Runs in its own environment (``make test-triton``: .venv plus the ``triton`` wheel, ``TRITON_INTERPRET=1``);
skipped elsewhere.
"""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 (make test-triton)"
)

OUTPUTS = ("entropy", "log_sum_sq_probs", "mean_logits", "is_top1")


@pytest.fixture
def kernel(monkeypatch):
    """TRL's kernel module with the CPU counted as a Triton device, and the number of Triton launches. Its torch
    fallbacks raise, so a passing test cannot have run them."""
    from trl.kernels import chunked_logprob as k

    assert k._TRITON_AVAILABLE, "TRL imported without Triton: the kernels below would be plain functions"
    launches = {"forward": 0, "backward": 0}

    class Counted:
        def __init__(self, jitted, name):
            self.jitted, self.name = jitted, name

        def __getitem__(self, grid):
            launches[self.name] += 1
            return self.jitted[grid]

    def no_fallback(*args, **kwargs):
        raise AssertionError("TRL's torch fallback ran where its Triton kernel should have")

    monkeypatch.setattr(k, "_use_triton", lambda device: True)
    monkeypatch.setattr(k, "_forward_kernel", Counted(k._forward_kernel, "forward"))
    monkeypatch.setattr(k, "_backward_kernel", Counted(k._backward_kernel, "backward"))
    monkeypatch.setattr(k, "_forward_tile", no_fallback)
    monkeypatch.setattr(k, "_backward_tile", no_fallback)
    return k, launches


def _inputs(n=29, h=16, v=2500, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.5).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    targets[:4] = 0
    weight.data[0] = hidden.data[:4].mean(0) * 4  # vocab 0 is the argmax of rows 0..3: both is_top1 values occur
    return hidden, weight, b, targets


def _fp64(hidden, weight, bias, targets, temperature, scale, softcap):
    """Log-probs, entropy, log(sum p^2), mean logit, is-top-1 from the full [N, V] logits in fp64."""
    z = hidden.detach().double() @ weight.detach().double().T  # [N, V]
    if bias is not None:
        z = z + bias.detach().double()
    z = z * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    logp = torch.log_softmax(z, -1)  # [N, V]
    return (
        logp.gather(1, targets[:, None]).squeeze(1),
        -(logp.exp() * logp).sum(-1),
        torch.logsumexp(2 * logp, -1),
        z.mean(-1),
        z.argmax(-1) == targets,
    )


def _grads(outs, tensors):
    logps, ent = outs[0], outs[1]
    grads = torch.autograd.grad((logps * 0.7).sum() + (ent * 0.3).sum(), [t for t in tensors if t is not None])
    return [g.double() for g in grads]


@pytest.mark.parametrize(
    "temperature,use_bias,scale,softcap,chunk",
    [
        (1.0, False, 1.0, None, 1024),  # three vocabulary tiles, the last one ragged
        (0.7, True, 0.5, 30.0, 4096),  # one tile over the whole vocabulary; Gemma soft-cap, Granite scale
    ],
)
def test_triton_kernel_matches_fp64_and_slimrls_op(kernel, temperature, use_bias, scale, softcap, chunk):
    from slimrl.ops.chunked_logprob import chunked_logprob_outputs

    k, launches = kernel
    hidden, weight, bias, targets = _inputs(bias=use_bias)
    tensors = (hidden, weight, bias)
    got = k.ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature, chunk, softcap, scale, OUTPUTS)
    assert launches["forward"] > 0
    ref = _fp64(hidden, weight, bias, targets, temperature, scale, softcap)
    ours = chunked_logprob_outputs(
        hidden,
        weight,
        targets,
        bias,
        temperature,
        outputs=("log_probs", *OUTPUTS),
        chunk_rows=7,
        logit_scale=scale,
        softcap=softcap,
    )
    for name, a, r, s in zip(("log_probs", *OUTPUTS), got, ref, ours):
        if name == "is_top1":
            assert torch.equal(a, r) and torch.equal(a, s), name
            assert a.any() and not a.all(), "the case must hold both top-1 and other targets"
            continue
        torch.testing.assert_close(a.double(), r, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n} vs fp64: {m}")
        torch.testing.assert_close(a, s, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n} vs slimrl: {m}")

    triton_grads = _grads(got, tensors)
    assert launches["backward"] > 0
    slimrl_grads = _grads(ours, tensors)
    with torch.enable_grad():
        h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
        b64 = bias.detach().double().requires_grad_() if bias is not None else None
        z = (h64 @ w64.T + (b64 if b64 is not None else 0.0)) * scale
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        logp = torch.log_softmax(z / temperature, -1)
        fp64_grads = _grads(
            (logp.gather(1, targets[:, None]).squeeze(1), -(logp.exp() * logp).sum(-1)), (h64, w64, b64)
        )
    for name, a, r, s in zip(("hidden", "weight", "bias"), triton_grads, fp64_grads, slimrl_grads):
        torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"grad {n} vs fp64: {m}")
        torch.testing.assert_close(a, s, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"grad {n} vs slimrl: {m}")


def test_routing_hands_back_to_the_triton_kernel_unless_chunking_is_set(kernel, monkeypatch, tmp_path):
    """DPO on TRL's fused head with the CPU as a Triton device: TRL alone, patched (automatic chunking: TRL's Triton
    kernel serves every call), patched with ``unsloth_num_chunks=2`` (slimrl's kernel serves, Triton not called)."""
    from trl.trainer import utils

    from slimrl import PatchFastRL, unpatch
    from slimrl.patching.routes import fused_head, served
    from tests.patching.parity import first_batch, loss_and_grads, worst_parameter_error
    from tests.patching.routes.test_fused_head import dpo_trainer

    k, launches = kernel
    monkeypatch.setattr(utils, "_use_triton", k._use_triton)  # TRL's fused forward gathers valid rows, as on CUDA

    trainer = dpo_trainer(tmp_path, use_weighting=True)  # WPO: log_sum_sq_probs goes through the kernel too
    unpatch()
    inputs = first_batch(trainer)
    ref_loss, ref_grads, ref_metrics = loss_and_grads(trainer, inputs)
    assert launches["forward"] > 0 and launches["backward"] > 0, "TRL alone did not run its Triton kernel"
    assert any(g.abs().max() > 0 for g in ref_grads.values()), "no gradient: the test would be vacuous"

    def patched(**args) -> tuple[float, dict, dict, int, int]:
        before, calls = dict(launches), served(trainer)
        PatchFastRL("dpo")
        try:
            assert fused_head._trl_kernel_is_best(torch.device("cpu")), "the CPU must count as a Triton device"
            for key, value in args.items():
                setattr(trainer.args, key, value)
            loss, grads, metrics = loss_and_grads(trainer, inputs)
        finally:
            unpatch()
        return loss, grads, metrics, launches["forward"] - before["forward"], served(trainer) - calls

    for args, triton_runs in (({}, True), ({"unsloth_num_chunks": 2}, False)):
        loss, grads, metrics, triton_calls, slimrl_calls = patched(**args)
        if triton_runs:
            assert triton_calls > 0 and slimrl_calls == 0, (triton_calls, slimrl_calls)
        else:
            assert triton_calls == 0 and slimrl_calls > 0, (triton_calls, slimrl_calls)
        assert abs(loss - ref_loss) <= 1e-4 * max(abs(ref_loss), 1e-3), (args, loss, ref_loss)
        worst, name = worst_parameter_error(grads, ref_grads)
        assert grads.keys() == ref_grads.keys() and worst <= 1e-4, (args, name, worst)
        for key, ref in ref_metrics.items():
            assert abs(metrics[key] - ref) <= 1e-4 * max(abs(ref), 1.0), (args, key, metrics[key], ref)


@pytest.mark.parametrize("chunks", [None, 2])
def test_grpo_projects_through_the_triton_kernel_unless_chunking_is_set(kernel, monkeypatch, tmp_path, chunks):
    """GRPO's method-capture route on a Triton device: the rows it selects (completion positions, each prompt once)
    are projected by TRL's Triton kernel, never slower than TRL's own pass; slimrl's torch op runs only for a chunking
    the user chose. Both equal TRL alone (whose pass runs the same kernel)."""
    from trl.trainer import utils

    from slimrl.patching.routes import head
    from tests.patching.parity import assert_patched_equals_unpatched
    from tests.patching.trainers.test_grpo import run_grpo

    k, launches = kernel
    monkeypatch.setattr(utils, "_use_triton", k._use_triton)
    ops = {"calls": 0}

    def counting(op):
        def counted(*args, **kwargs):
            ops["calls"] += 1
            return op(*args, **kwargs)

        return counted

    for name in ("chunked_logprob_outputs", "masked_token_logprobs"):
        monkeypatch.setattr(head, name, counting(getattr(head, name)))
    extra = {} if chunks is None else {"unsloth_num_chunks": chunks}
    before = {}

    def run(out):
        before.update(launches)
        result = run_grpo(out, "dapo", 0.04, **(extra if "slim" in str(out) else {}))
        before["run"] = launches["forward"] - before["forward"]
        return result

    ops_before = ops["calls"]
    assert_patched_equals_unpatched(run, "grpo", tmp_path)
    if chunks is None:
        assert before["run"] > 0 and ops["calls"] == ops_before, "the patched run did not use TRL's Triton kernel"
    else:
        assert before["run"] == 0 and ops["calls"] > ops_before, "a chosen chunking must run slimrl's op"
