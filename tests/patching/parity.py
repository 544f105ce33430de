"""Shared helpers for the patched-vs-unpatched parity tests.

:func:`assert_patched_equals_unpatched`: a training run (generation included) done twice from the same seed, with TRL
alone and after ``PatchFastRL`` (``unpatch`` after): same sampled completions, same parameter updates (SGD, so an
update is proportional to its gradient), same logged losses.

:func:`assert_parity`: one trainer and one batch. The fused-head patches (:mod:`slimrl.patching.routes.fused_head`)
act at call time, so the same trainer object and the same batch are run twice: once with TRL alone, once after
``PatchFastRL``; loss, every parameter gradient and the metrics TRL logs from the fused outputs (entropy, mean
logits, top-1 accuracy, WPO weights) must agree.

Tolerance: relative error <= 1e-4 (fp32; the two kernels sum the vocabulary in different tile orders, ~1e-6
relative per reduction, accumulated through a 2-layer backward).
"""

from __future__ import annotations

import math

import torch

from slimrl import PatchFastRL, unpatch
from slimrl.patching.every_trainer.steps import running
from slimrl.patching.routes import served
from slimrl.verify.relative_error import joint_error, relative_error, worst_parameter_error
from slimrl.verify.scenarios import PAIRS  # noqa: F401  (the parity tests' pairs are verify's)

CUMULATIVE = {"num_tokens"}  # running totals over the trainer's life, not per-batch values


def experimental(name: str):
    """``trl.experimental.<name>`` without TRL's experimental-import warning."""
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(f"trl.experimental.{name}")


def tiny_model(lora: bool, targets: tuple[str, ...] = ("q_proj", "v_proj")):
    """The tiny Llama (seed 0), optionally with a LoRA adapter whose A and B are both random (so both get
    gradient on the first step)."""
    from tests.tiny import tiny_llama

    model = tiny_llama(seed=0)
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(1)
        model = get_peft_model(
            model,
            LoraConfig(r=4, lora_alpha=8, target_modules=list(targets), init_lora_weights=False, task_type="CAUSAL_LM"),
        )
    return model


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """slimrl verify's relative error (:func:`slimrl.verify.relative_error.relative_error`)."""
    return relative_error(a, b)


def first_batch(trainer) -> dict:
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer._prepare_inputs(batch)


def _metric_store(trainer) -> dict:
    """Where the trainer keeps per-step metrics: ``_metrics`` (TRL's stable trainers) or ``_stored_metrics``."""
    store = getattr(trainer, "_metrics", None) or trainer._stored_metrics
    return store["train"]


def loss_and_grads(trainer, inputs: dict) -> tuple[float, dict[str, torch.Tensor], dict[str, float]]:
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    store = _metric_store(trainer)
    for values in store.values():
        values.clear()
    torch.manual_seed(0)
    with running(trainer):  # as the trainer's training_step runs it: the fused-head kernel reads the config
        loss = trainer.compute_loss(model, dict(inputs))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    metrics = {k: float(sum(v) / len(v)) for k, v in store.items() if v and k not in CUMULATIVE}
    return float(loss), grads, metrics


def both_sides(trainer, algorithm: str, inputs: dict) -> tuple[tuple, tuple]:
    """:func:`loss_and_grads` of one batch with TRL alone, then patched (unpatched after); asserts slimrl's
    log-prob path served the patched side."""
    unpatch()
    ref = loss_and_grads(trainer, inputs)
    calls = served(trainer)
    PatchFastRL(algorithm)
    try:
        mine = loss_and_grads(trainer, inputs)
    finally:
        unpatch()
    assert served(trainer) > calls, "slimrl's log-prob path was not used"
    return ref, mine


def assert_parity(trainer, algorithm: str, rtol: float = 1e-4) -> dict[str, float]:
    """TRL alone, then patched, on the same trainer and batch; returns the patched metrics."""
    unpatch()
    (ref_loss, ref_grads, ref_metrics), (loss, grads, metrics) = both_sides(trainer, algorithm, first_batch(trainer))
    assert math.isfinite(ref_loss)
    assert ref_grads and any(g.abs().max() > 0 for g in ref_grads.values()), "no gradient: the test would be vacuous"
    assert abs(loss - ref_loss) <= rtol * max(abs(ref_loss), 1e-3), f"loss {loss} vs TRL {ref_loss}"
    assert grads.keys() == ref_grads.keys()
    worst, name = worst_parameter_error(grads, ref_grads)
    assert worst <= rtol, f"{name}: relative error {worst:.2e}"
    assert metrics.keys() == ref_metrics.keys()
    for key, ref in ref_metrics.items():
        assert abs(metrics[key] - ref) <= rtol * max(abs(ref), 1.0), f"metric {key}: {metrics[key]} vs TRL {ref}"
    return metrics


def assert_patched_equals_unpatched(run, algorithm: str, tmp_path, rtol: float = 1e-4):
    """``run(out_dir) -> (completions seen, {param: update}, logged losses, trainer)``, first with TRL alone, then
    patched; asserts slimrl's path ran, the run is not vacuous, and updates/losses agree within ``rtol`` (relative);
    returns the patched trainer."""

    unpatch()
    ref_seen, ref_deltas, ref_losses, _ = run(tmp_path / "trl")
    PatchFastRL(algorithm)
    try:
        seen, deltas, losses, trainer = run(tmp_path / "slim")
    finally:
        unpatch()
    assert served(trainer) > 0, "slimrl's log-prob path was not used"
    assert seen == ref_seen, "patched run sampled different completions"
    assert any(d.abs().max() > 0 for d in ref_deltas.values()), "no update happened: the test would be vacuous"
    assert deltas.keys() == ref_deltas.keys(), "different parameters were updated"
    # the whole update as one vector, as `slimrl verify` compares it: step two's gradient is taken at weights that
    # differ by step one's rounding, and a parameter whose two steps nearly cancel magnifies that in a per-parameter
    # ratio (measured: 2.3e-4 on one LoRA matrix of the agentic rows on an AVX-512 CPU, 3e-6 over all of them)
    joint = joint_error(deltas, ref_deltas)
    worst, name = worst_parameter_error(deltas, ref_deltas)
    assert joint <= rtol, f"update: relative error {joint:.2e} (worst parameter {name}: {worst:.2e})"
    assert len(losses) == len(ref_losses), (losses, ref_losses)
    # a loss after the first step is taken at weights that already differ by the earlier steps' rounding: to first
    # order by at most |grad| * |weights' difference| (3x margin); the first step's loss only by rtol (measured:
    # RLOO's second loss 1.06e-4 apart with half its tokens at the clip boundary, within that bound)
    diff = math.sqrt(sum(float((deltas[n] - ref_deltas[n]).double().pow(2).sum()) for n in ref_deltas))
    norms = [float(h["grad_norm"]) for h in trainer.state.log_history if "grad_norm" in h]
    for k, (got, ref) in enumerate(zip(losses, ref_losses, strict=True)):
        drift = 3 * norms[k] * diff if 0 < k < len(norms) else 0.0
        assert abs(got - ref) <= rtol * abs(ref) + 1e-6 + drift, f"loss {k}: {got} vs TRL alone {ref}"
    return trainer
