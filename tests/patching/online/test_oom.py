"""Out-of-memory recovery (slimrl/patching/online/oom.py): a forced allocation failure, injected once, in the no-grad
log-prob pass, the policy forward or inside the model's backward; the run splits the micro-batch in halves and
must equal TRL alone (no failure there) on the parameter updates and logged losses, log ``memory/oom_splits`` and
keep the smaller size.

Tolerance: relative error <= 1e-4 on the updates (fp32; as the GRPO parity tests: the rows are recomputed in
slices, so the matrix products run on different row counts, ~1e-7 relative per op).
"""

from __future__ import annotations

import pytest
import torch

from slimrl.patching.every_trainer.state import trainer_state
from slimrl.patching.online import logps, oom
from tests.patching.parity import assert_patched_equals_unpatched
from tests.patching.trainers.test_grpo import run_grpo


class _Injector:
    """Raise ``torch.OutOfMemoryError`` once: in the log-prob route (``where`` = "no_grad" / "forward") when it
    gets more than 2 rows, or ("backward") from inside the model's backward of a policy forward of 4 rows."""

    def __init__(self, where: str):
        self.where, self.fired, self.armed_backward = where, 0, False

    def route(self, orig):
        def wrapped(target, trainer, model, input_ids, *args, **kwargs):
            grad = torch.is_grad_enabled()
            if not self.fired and input_ids.size(0) > 2 and self.where == ("forward" if grad else "no_grad"):
                self.fired += 1
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
            self.armed_backward = grad and input_ids.size(0) > 2 and not self.fired and self.where == "backward"
            try:
                return orig(target, trainer, model, input_ids, *args, **kwargs)
            finally:
                self.armed_backward = False

        return wrapped

    def mlp_hook(self, module, args, output):
        if self.armed_backward:

            def fail(grad):
                if not self.fired:
                    self.fired += 1
                    raise torch.OutOfMemoryError("CUDA out of memory (injected in the backward)")

            output.register_hook(fail)


@pytest.mark.parametrize(
    ("where", "loss_type", "beta"),
    [
        ("no_grad", "dapo", 0.04),
        ("forward", "grpo", 0.0),
        ("backward", "dapo", 0.04),
        ("backward", "dr_grpo", 0.0),
    ],
)
def test_out_of_memory_split_equals_trl(tmp_path, monkeypatch, where, loss_type, beta):
    from transformers.models.llama import modeling_llama

    injector = _Injector(where)
    monkeypatch.setattr(logps, "logps_and_entropies_through_ops", injector.route(logps.logps_and_entropies_through_ops))
    orig_mlp = modeling_llama.LlamaMLP.forward

    def mlp_forward(module, x):
        out = orig_mlp(module, x)
        injector.mlp_hook(module, (x,), out)
        return out

    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", mlp_forward)
    from trl import GRPOConfig

    has_bonus = "entropy_coef" in GRPOConfig.__dataclass_fields__  # the entropy then carries gradient too
    extra = {"entropy_coef": 0.1} if where == "forward" and has_bonus else {}
    trainer = assert_patched_equals_unpatched(lambda out: run_grpo(out, loss_type, beta, **extra), "grpo", tmp_path)
    assert injector.fired == 1, "the failure was not injected: the test would be vacuous"
    logged = [h["memory/oom_splits"] for h in trainer.state.log_history if "memory/oom_splits" in h]
    assert logged and logged[-1] == 1.0
    kept = trainer_state(trainer).no_grad_rows if where == "no_grad" else trainer_state(trainer).grad_rows
    assert kept == 2
    assert trainer_state(trainer).shared_prefix_forwards > 0, "the split rows did not take the shared-prefix layout"


def test_not_out_of_memory_is_raised_unchanged():
    assert oom.is_out_of_memory(torch.OutOfMemoryError("x"))
    assert oom.is_out_of_memory(MemoryError())
    assert oom.is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8"))
    assert not oom.is_out_of_memory(RuntimeError("shape mismatch"))
    assert not oom.is_out_of_memory(ValueError("out of memory"))


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some other API call",
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    ],
)
def test_a_failure_the_device_reports_is_never_retried(tmp_path, monkeypatch, capsys, patched, message):
    """Only the allocator's own ``OutOfMemoryError`` (raised before the kernel runs) is retried; an error CUDA reports
    from the device (asynchronous, the context maybe corrupted) is raised as it is, with one line, and nothing is
    split."""
    assert not oom.is_out_of_memory(RuntimeError(message)) and oom.device_failure(RuntimeError(message))
    fired = []

    def failing(target, trainer, model, input_ids, *args, **kwargs):
        fired.append(input_ids.size(0))
        raise RuntimeError(message)

    monkeypatch.setattr(logps, "logps_and_entropies_through_ops", failing)
    with pytest.raises(RuntimeError, match="CUDA error"):
        run_grpo(tmp_path, "dapo", 0.04)
    out = capsys.readouterr().out
    assert len(fired) == 1 and "retrying" not in out
    assert [line for line in out.splitlines() if line.startswith("slimrl: the GPU reported a failure")] != []


def test_grads_set_aside_adds_or_restores():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    with oom.grads_set_aside([p]):
        (p * 3).sum().backward()
    assert torch.equal(p.grad, torch.full((3,), 5.0))
    with pytest.raises(RuntimeError), oom.grads_set_aside([p]):
        (p * 7).sum().backward()
        raise RuntimeError("failed half-way")
    assert torch.equal(p.grad, torch.full((3,), 5.0))


def test_rloo_backward_out_of_memory_equals_trl(tmp_path, monkeypatch):
    """RLOO (TRL's fused head on >= 1.15, the method capture before): a failure inside the model's backward of
    the 4-row policy forward, recovered by slices."""
    from transformers.models.llama import modeling_llama

    from tests.patching.trainers.test_rloo import run_rloo

    fired = []
    orig_mlp = modeling_llama.LlamaMLP.forward

    def mlp_forward(module, x):
        out = orig_mlp(module, x)
        if armed[0] and torch.is_grad_enabled() and not fired:  # the first policy forward (4 rows, packed into 1)

            def fail(grad):
                if not fired:
                    fired.append(1)
                    raise torch.OutOfMemoryError("CUDA out of memory (injected in the backward)")

            out.register_hook(fail)
        return out

    armed = [False]
    monkeypatch.setattr(modeling_llama.LlamaMLP, "forward", mlp_forward)

    def run(out):
        armed[0] = "slim" in str(out)
        return run_rloo(out, 0.04, True)

    trainer = assert_patched_equals_unpatched(run, "rloo", tmp_path)
    assert fired, "the failure was not injected: the test would be vacuous"
    assert trainer_state(trainer).grad_rows == 2
    assert trainer_state(trainer).shared_prefix_forwards > 0
    assert [h["memory/oom_splits"] for h in trainer.state.log_history if "memory/oom_splits" in h][-1] == 1.0


@pytest.mark.parametrize(
    ("error", "ran_out"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (RuntimeError("shape mismatch"), False),
    ],
)
def test_slimrl_compare_records_every_out_of_memory_and_retries_only_the_allocators(error, ran_out):
    """One detector (slimrl/compat/runtime/allocation_errors.py) for the trainers' recovery and ``slimrl compare``: a
    side that ran out of memory, wherever it was found, is recorded as not fitting; only the allocator's own is
    retried."""
    from slimrl.compat.runtime.allocation_errors import ran_out_of_memory

    assert ran_out_of_memory(error) is ran_out
    assert oom.is_out_of_memory(error) is isinstance(error, torch.OutOfMemoryError)
