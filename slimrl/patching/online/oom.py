"""Out-of-memory recovery for the online trainers' log-prob passes and the policy's backward (GRPO, RLOO).

A micro-batch that runs out of memory (the CUDA allocator's ``OutOfMemoryError``; on CPU a ``MemoryError`` or the
allocator's "can't allocate memory"; never an error CUDA reports from the device, :func:`device_failure`) is split
in halves and retried, and the smaller size is kept for the rest of the run; every split is counted in the metric
``memory/oom_splits``. The loss and its normalisation stay TRL's, computed once over the whole micro-batch, because
only the *log-prob* side is split:

* **no-grad passes** (old / reference log-probs): rows are independent, so the pass runs on row slices of half the
  size and the results are concatenated (:func:`logps_with_recovery`).
The policy's log-probs and entropies reach TRL's loss through one autograd node (:class:`_PolicyOutputs`), whose
backward receives ``dL/dlogp`` and ``dL/dH`` ``[B, C]`` (already scaled for gradient accumulation and fp16 loss
scaling by whoever called ``backward``) and sends them into the model (:func:`backward_into_model`). The loss
depends on the parameters only through those two tensors, so by the chain rule
``dL/dtheta = sum_slices (dL/dlogp[s])^T dlogp[s]/dtheta + (dL/dH[s])^T dH[s]/dtheta``: back-propagating the rows
slice by slice gives the gradient of the unsplit micro-batch, with TRL's normalisation of every loss type (dapo,
grpo, bnpo, dr_grpo, ...) untouched, and TRL's loss, metrics and state computed exactly once.

* **policy forward** (with grad) out of memory: the outputs are computed without grad on row slices of half the
  size; the node's backward recomputes each slice with grad and back-propagates its rows.
* **policy backward** out of memory (inside the model): the node holds the only reference to the forward's graph,
  so it drops it (its activations are freed), discards this micro-batch's partial gradients (the parameters'
  gradients were set aside before it, :func:`grads_set_aside`) and goes on slice by slice as above.

Limits: one process (under DDP/FSDP/DeepSpeed the error is raised unchanged: a split on one rank would desynchronise
the collective calls); vision-language inputs and MoE aux losses are not split; backward recovery sets the
parameters' gradients aside only for adapter training (trainable parameters <= 10 % of the model: the copy is small)
or while no gradient has been accumulated yet. ``slimrl_oom_recovery=False`` turns it all off.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from slimrl.compat.runtime.allocation_errors import device_failure, is_out_of_memory
from slimrl.patching.every_trainer.extra_fields import fields_of
from slimrl.patching.every_trainer.state import trainer_state

Compute = Callable[[torch.Tensor, torch.Tensor, int | None], tuple]  # (ids, mask, batch_size) -> (logps, H, aux)


def _raise_unless_out_of_memory(error: BaseException, rows: int) -> None:
    """Re-raise ``error`` unless it is a recoverable out-of-memory with rows left to split (one line first for an
    error the device reported)."""
    line = device_failure(error)
    if line is not None:
        print(line, flush=True)
    if not is_out_of_memory(error) or rows == 1:
        raise error


def free_memory() -> None:
    """Drop what the failed attempt left (its frames hold tensors until collected)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def enabled(trainer: Any) -> bool:
    """Recovery on: the config field is on and the run is one process."""
    if not fields_of(trainer.args).slimrl_oom_recovery:
        return False
    accelerator = getattr(trainer, "accelerator", None)
    return getattr(accelerator, "num_processes", 1) == 1


def _count_split(trainer: Any, where: str, rows: int, new_rows: int) -> None:
    trainer_state(trainer).oom_splits += 1
    print(
        f"slimrl: out of memory in the {where} ({rows} rows); retrying in slices of {new_rows} rows (same loss and "
        f"gradients; kept for the rest of the run)",
        flush=True,
    )


@dataclass
class _PolicyCall:
    """The grad-enabled policy call of a micro-batch: how to recompute its rows, and (unsplit path) its outputs
    with their graph into the model, held only here so that dropping them frees the graph's activations."""

    compute: Compute
    input_ids: torch.Tensor  # [B, P + C]
    attention_mask: torch.Tensor  # [B, P + C]
    outputs: tuple | None = None  # (logps [B, C], entropies [B, C] | None) with grad; None once back-propagated
    counted: bool = True  # whether the forward counted its trained tokens (the recompute must then not)


def logps_with_recovery(
    trainer: Any,
    compute: Compute,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    batch_size: int | None,
    compute_entropy: bool,
) -> tuple:
    """``compute(input_ids, attention_mask, batch_size)`` (a trainer's log-prob method with its other arguments
    bound) with the recovery of the module docstring."""
    if not enabled(trainer):
        return compute(input_ids, attention_mask, batch_size)
    if not torch.is_grad_enabled():
        return _no_grad(trainer, compute, input_ids, attention_mask, batch_size)
    rows = input_ids.size(0)
    split = trainer_state(trainer).grad_rows
    call = _PolicyCall(compute, input_ids, attention_mask)
    if split is None or split >= rows:
        try:
            logps, entropies, aux = compute(input_ids, attention_mask, batch_size)
        except Exception as error:
            _raise_unless_out_of_memory(error, rows)
            del error
            free_memory()
            split = max(1, rows // 2)
            trainer_state(trainer).grad_rows = split
            _count_split(trainer, "policy forward", rows, split)
        else:
            if aux is not None or not logps.requires_grad:
                return logps, entropies, aux  # MoE aux loss: not split
            call.outputs = (logps, entropies)
            return (*_PolicyOutputs.apply(_anchor(), logps.detach(), _detach(entropies), trainer, call), None)
    with torch.no_grad():
        logps, entropies, _ = _no_grad(trainer, compute, input_ids, attention_mask, split)
    call.counted = False
    entropies = entropies if compute_entropy else None
    return (*_PolicyOutputs.apply(_anchor(), logps, entropies, trainer, call), None)


def _anchor() -> torch.Tensor:
    return torch.zeros((), requires_grad=True)  # a grad-requiring input, so that the node's backward runs


def _detach(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()


def _slices(rows: int, size: int) -> list[slice]:
    return [slice(s, min(s + size, rows)) for s in range(0, rows, size)]


def _retry_halving(trainer: Any, attr: str, where: str, size: int, attempt: Callable[[int], Any]) -> Any:
    """``attempt(size)``; while it runs out of memory, halve ``size`` (kept in the trainer's state ``attr`` for the
    rest of the run) and try again; the error is raised unchanged at one row or when it is not an out-of-memory."""
    while True:
        try:
            return attempt(size)
        except Exception as error:
            _raise_unless_out_of_memory(error, size)
            del error
        free_memory()  # outside the handler: the failed attempt's frames are gone
        new = max(1, size // 2)
        setattr(trainer_state(trainer), attr, new)
        _count_split(trainer, where, size, new)
        size = new


def _no_grad(trainer, compute, input_ids, attention_mask, batch_size) -> tuple:
    rows_total = input_ids.size(0)
    size = min(batch_size or rows_total, trainer_state(trainer).no_grad_rows or rows_total)
    outs = _retry_halving(
        trainer,
        "no_grad_rows",
        "no-grad log-prob pass",
        size,
        lambda n: [compute(input_ids[s], attention_mask[s], n) for s in _slices(rows_total, n)],
    )
    logps = torch.cat([o[0] for o in outs])  # [B, C]
    entropies = torch.cat([o[1] for o in outs]) if outs[0][1] is not None else None  # [B, C]
    aux = torch.stack([o[2] for o in outs]).mean() if outs[0][2] is not None else None
    return logps, entropies, aux


class _PolicyOutputs(torch.autograd.Function):
    """The policy's log-probs ``[B, C]`` and entropies ``[B, C]`` as TRL's loss sees them; the backward sends the
    loss's gradients into the model: through the forward's own graph, or (after an out-of-memory) slice by slice,
    recomputed (:func:`backward_into_model`)."""

    @staticmethod
    def forward(ctx, anchor, logps, entropies, trainer, call):  # noqa: ARG004
        ctx.set_materialize_grads(False)
        ctx.trainer, ctx.call = trainer, call
        return logps.clone(), (entropies.clone() if entropies is not None else None)

    @staticmethod
    def backward(ctx, grad_logps, grad_entropies):
        backward_into_model(ctx.trainer, ctx.call, grad_logps, grad_entropies)
        ctx.call = None
        return None, None, None, None, None


def backward_into_model(
    trainer: Any, call: _PolicyCall, grad_logps: torch.Tensor | None, grad_entropies: torch.Tensor | None
) -> None:
    """Back-propagate the loss's gradients w.r.t. the policy's outputs into the model (module docstring)."""
    grads = {i: g for i, g in enumerate((grad_logps, grad_entropies)) if g is not None}
    if not grads:
        call.outputs = None
        return
    params = _trainable(trainer)
    if call.outputs is not None:
        outs = [call.outputs[i] for i in grads]
        if not _can_set_aside(trainer, params):
            call.outputs = None
            torch.autograd.backward(outs, list(grads.values()))
            return
        try:
            with grads_set_aside(params):
                torch.autograd.backward(outs, list(grads.values()))
            call.outputs = None
            return
        except Exception as error:
            _raise_unless_out_of_memory(error, call.input_ids.size(0))
            del error
        call.outputs = None  # the only reference to the failed graph: its activations go
        del outs
        free_memory()
        rows = call.input_ids.size(0)
        state = trainer_state(trainer)
        state.grad_rows = min(state.grad_rows or rows, max(1, rows // 2))
        _count_split(trainer, "policy backward", rows, state.grad_rows)
    _backward_in_slices(trainer, call, grads, params)


def _backward_in_slices(trainer: Any, call: _PolicyCall, grads: dict[int, torch.Tensor], params: list) -> None:
    """Recompute ``trainer_state(trainer).grad_rows`` rows at a time with grad and back-propagate their slice of
    ``grads``; a slice that runs out of memory halves the size again (that attempt's gradients discarded)."""
    rows = call.input_ids.size(0)
    tokens = trainer_state(trainer).trained_tokens

    def attempt(size: int) -> None:
        trainer_state(trainer).trained_tokens = tokens
        with grads_set_aside(params):
            for s in _slices(rows, size):
                with torch.enable_grad():
                    outs = call.compute(call.input_ids[s], call.attention_mask[s], size)
                torch.autograd.backward([outs[i] for i in grads], [g[s] for g in grads.values()])

    _retry_halving(trainer, "grad_rows", "policy backward", trainer_state(trainer).grad_rows, attempt)
    if call.counted:  # the first forward counted this micro-batch's tokens already
        trainer_state(trainer).trained_tokens = tokens


def _trainable(trainer: Any) -> list[torch.nn.Parameter]:
    return [p for p in trainer.model.parameters() if p.requires_grad]


@contextmanager
def grads_set_aside(params: list[torch.nn.Parameter]) -> Iterator[None]:
    """Run a backward into fresh ``.grad`` s: on success they are added to the gradients accumulated before it
    (``old + new``, the sum the autograd engine itself would form), on failure discarded and the old ones put back."""
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    except BaseException:
        for p, old in zip(params, saved, strict=True):
            p.grad = old
        raise
    for p, old in zip(params, saved, strict=True):
        if old is not None:
            p.grad = old if p.grad is None else old.add_(p.grad)


def _can_set_aside(trainer: Any, params: list[torch.nn.Parameter]) -> bool:
    """Adapter training (a small copy) or nothing accumulated yet."""
    if all(p.grad is None for p in params):
        return True
    return sum(p.numel() for p in params) <= 0.1 * sum(p.numel() for p in trainer.model.parameters())


@contextmanager
def step(trainer: Any) -> Iterator[None]:
    """One training step of a patched online trainer: the running total of out-of-memory splits goes to its
    metrics (``memory/oom_splits``) once there was one; an out-of-memory that ends step 1 of a
    ``slimrl_longest_first`` run is raised with the plan's numbers (:mod:`slimrl.patching.online.longest_first`)."""
    try:
        yield
    except Exception as error:
        if not (is_out_of_memory(error) and trainer_state(trainer).longest_done and trainer.state.global_step == 0):
            raise
        from slimrl.patching.online.longest_first import failure_message

        raise MemoryError(failure_message(trainer, error)) from error
    splits = trainer_state(trainer).oom_splits
    metrics = getattr(trainer, "_metrics", None)
    if splits and isinstance(metrics, dict) and "train" in metrics:
        metrics["train"]["memory/oom_splits"].append(float(splits))
