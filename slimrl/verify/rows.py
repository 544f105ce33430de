"""One row of ``slimrl verify``: the same small run with TRL alone and patched, compared (losses, first-step
gradients, the update), with the tolerance each dtype allows and why; the generator rows' check of the sampled
tokens' log-probs."""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slimrl.verify.agentic import KINDS as AGENTIC
from slimrl.verify.agentic import scenario as agentic_scenario
from slimrl.verify.reference import trl_kernel_where_missing
from slimrl.verify.relative_error import joint_error, loss_error, worst_parameter_error
from slimrl.verify.replay import record_or_replay, replays
from slimrl.verify.scenarios import Kit, Setup, UnquantizableError


def probed() -> tuple[str, ...]:
    """The trainers whose generation is checked against the training model (the table's ``generation_check``)."""
    from slimrl.patching.table import every_trainer

    return tuple(n for n, spec in every_trainer().items() if spec.about.generation_check)


# Tolerances (relative error) by training dtype, and why.
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}
REASON = {
    torch.float32: "fp32: slimrl and TRL sum the vocabulary in different chunk orders (~1e-6 relative per "
    "reduction), accumulated through the backward and two steps",
    torch.bfloat16: "bf16 (also a QLoRA adapter, which TRL keeps in bf16): 8 mantissa bits; the two paths round "
    "differently before the fp32 softmax",
    torch.float16: "fp16: 11 mantissa bits; the two paths round the logits' matmul differently",
}


# Largest |log p_generator - log p_training| of a sampled token, by dtype, and why (an absolute log-prob difference).
GEN_TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-1, torch.float16: 5e-2}
GEN_TOLERANCE_VLLM = {torch.float32: 2e-3, torch.bfloat16: 1e-1, torch.float16: 5e-2}
GEN_REASON_VLLM = "vLLM's kernels and sampler compute the log-softmax in their own order"
GEN_REASON = {
    torch.float32: "generation reuses cached keys/values where the training forward recomputes them (~1e-6)",
    torch.bfloat16: "bf16: cached and recomputed attention round differently (8 mantissa bits)",
    torch.float16: "fp16: cached and recomputed attention round differently (11 mantissa bits)",
}


@dataclass
class Row:
    trainer: str
    loss_type: str
    loss_err: float
    grad_err: float
    update_err: float
    tolerance: float
    seconds: float
    problem: str = ""  # why the row fails beyond the numbers (no gradient, slimrl's path unused, an error)
    skipped: str = ""  # why there is nothing to compare with (TRL alone cannot run here; slimrl's side did run)
    gen_err: float = math.nan  # generator vs training log-prob (GRPO/RLOO; NaN: not checked)
    gen_tolerance: float = math.nan
    generator: str = "hf"  # "hf": compared with TRL alone; "engine" / "server": the generator check only
    update_tolerance: float = math.nan  # the update's, when the stored weights' rounding is coarser (storage_floor)
    masked_share: float = math.nan  # engine/server rows: sequences TRL's default IS correction masked (mean per step)

    @property
    def passed(self) -> bool:
        generation_ok = math.isnan(self.gen_err) or self.gen_err <= self.gen_tolerance
        if self.generator != "hf":
            return not self.problem and math.isfinite(self.gen_err) and generation_ok
        update_tol = max(self.tolerance, 0.0 if math.isnan(self.update_tolerance) else self.update_tolerance)
        worst = max(self.loss_err, self.grad_err)
        return (
            not self.skipped
            and not self.problem
            and math.isfinite(worst)
            and worst <= self.tolerance
            and math.isfinite(self.update_err)
            and self.update_err <= update_tol
            and generation_ok
        )

    @property
    def failed(self) -> bool:
        return not self.skipped and not self.passed


def _run(
    name: str, loss_type: str, setup: Setup, patched: bool, out_dir: str, completions: list | None = None
) -> dict[str, Any]:
    """One side: build the trainer (patch state set first), train two steps, return losses, first-step gradients,
    updates and whether slimrl's log-prob path ran. ``completions``: TRL alone's sampled completions, recorded there
    and replayed in the patched run (:mod:`slimrl.verify.replay`)."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from slimrl.patching import PatchFastRL, trainer_and_config, unpatch
    from slimrl.patching.every_trainer.preflight import suspended
    from slimrl.patching.routes import served
    from slimrl.verify.generation import GenerationProbe, worst_difference

    unpatch()
    if patched:
        with suspended():  # this run is the check the self-check would make
            PatchFastRL(name)
    trainer_cls, config_cls = trainer_and_config(name)
    torch.manual_seed(0)
    from slimrl.patching.table import every_trainer

    scenario = agentic_scenario if loss_type in AGENTIC else every_trainer()[name].about.scenario
    trainer = scenario(Kit(trainer_cls, config_cls, out_dir, setup), loss_type)
    model = trainer.model
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in params.items()}
    grads: dict[str, torch.Tensor] = {}

    class FirstGradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if not grads:
                grads.update({n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None})

    probe = GenerationProbe(trainer) if patched and name in probed() and loss_type not in AGENTIC else None
    if completions is not None:
        record_or_replay(trainer, completions, replay=patched)
    trainer.add_callback(FirstGradients())
    trainer.remove_callback(PrinterCallback)  # the table is the output, not TRL's log dictionaries
    trainer.train()
    if probe is not None:
        probe.remove()
    return {
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "gen_err": worst_difference(probe, trainer.state.log_history) if patched else math.nan,
        "grads": grads,
        "updates": {n: p.detach() - before[n] for n, p in params.items()},
        "used": served(trainer) > 0,
        "vllm": bool(getattr(trainer, "use_vllm", False)),
        "exposure": rounding_exposure(params, {n: p.detach() - before[n] for n, p in params.items()}),
        "dtype": _lowest_precision([setup.dtype, *(p.dtype for p in params.values())]),
        "masked": _mean_logged(trainer.state.log_history, "sampling/is_masked_share/sequence"),
    }


def _mean_logged(history: list[dict], key: str) -> float:
    values = [h[key] for h in history if isinstance(h.get(key), int | float)]
    return sum(values) / len(values) if values else math.nan


def rounding_exposure(params: dict, updates: dict) -> float:
    """``sum_i |u_i| * s_i`` over 16-bit stored weights: ``u`` the run's update, ``s`` the dtype's spacing at the
    weight's value (0 for fp32 weights). Why: each step rounds every stored weight to its spacing, so two runs whose
    gradients differ by a relative ``g`` round element ``i`` differently with probability about ``g |u_i| / s_i``,
    each time by ``s_i``: their updates then differ by about ``sqrt(g * sum_i |u_i| s_i)`` (L2) with neither path
    wrong — an update much smaller than the weights (most of a LoRA's first steps) is measured only that well."""
    total = 0.0
    for name, p in params.items():
        if p.dtype not in (torch.bfloat16, torch.float16):
            continue
        w = p.detach().float().abs().clamp(min=torch.finfo(p.dtype).tiny)
        spacing = torch.finfo(p.dtype).eps * torch.exp2(torch.floor(torch.log2(w)))
        total += float((updates[name].float().abs() * spacing).sum())
    return total


def _lowest_precision(dtypes) -> torch.dtype:
    """The least precise of the run's floating dtypes: the model's (a bf16 base computes in bf16 under TRL's
    ``bf16=True`` whatever the adapter's dtype) and the trained parameters' (TRL keeps a QLoRA adapter in bf16)."""
    order = [torch.bfloat16, torch.float16, torch.float32]
    found = set(dtypes)
    return next((d for d in order if d in found), torch.float32)


def compare(name: str, loss_type: str, setup: Setup) -> Row:
    """One row: TRL alone vs patched (see the module docstring)."""
    from slimrl.patching import unpatch

    tol = TOLERANCE[setup.dtype]
    t0 = time.perf_counter()
    completions = [] if replays(setup.dtype, setup.device) and name in probed() else None
    with tempfile.TemporaryDirectory(prefix="slimrl-verify-") as tmp:
        with trl_kernel_where_missing():  # TRL 1.15 without Triton has no fused-head kernel: a plain one stands in
            ref, ref_error = _attempt(name, loss_type, setup, False, str(Path(tmp) / "trl"), completions)
        ours, our_error = _attempt(name, loss_type, setup, True, str(Path(tmp) / "slimrl"), completions)
    unpatch()
    nan = (math.nan, math.nan, math.nan)
    if ref is not None:  # TRL may train in a lower precision than the model's (a QLoRA adapter in bf16)
        tol = TOLERANCE[ref["dtype"]]
    if our_error:
        return Row(name, loss_type, *nan, tol, time.perf_counter() - t0, our_error)
    if ref_error:  # TRL alone fails where slimrl runs (e.g. TRL 1.15's fused head without Triton): no reference
        return Row(name, loss_type, *nan, tol, time.perf_counter() - t0, skipped=f"TRL alone fails here: {ref_error}")
    loss_err = loss_error(ours["losses"], ref["losses"])
    grad_err, _ = worst_parameter_error(ours["grads"], ref["grads"])
    update_err = joint_error(ours["updates"], ref["updates"])
    norm = math.sqrt(sum(float(u.float().pow(2).sum()) for u in ref["updates"].values()))
    # the gradients may differ by the dtype's tolerance; what that can do to 16-bit stored updates (3x: margin)
    floor = 3 * math.sqrt(tol * ref["exposure"]) / norm if norm > 0 else 0.0
    problem = ""
    if not any(u.abs().max() > 0 for u in ref["updates"].values()):
        problem = "no update in TRL's run (the comparison would be vacuous)"
    elif ours["grads"].keys() != ref["grads"].keys():
        problem = "different parameters got gradients"
    from slimrl.patching.table import every_trainer

    uses_ops = bool(every_trainer()[name].routes)
    if not problem and uses_ops and not ours["used"] and _route_applies(name, setup):
        problem = "slimrl's log-prob path did not run"
    if not problem and name in probed() and loss_type not in AGENTIC and math.isnan(ours["gen_err"]):
        problem = "no generated token was checked against the training model"
    # the generator computes in the trained parameters' precision too (a QLoRA adapter's bf16 branch): on a CPU with
    # native bf16 dot products (AVX512-BF16) one decoding row and the scored batch round differently at that level
    return Row(
        name,
        loss_type,
        loss_err,
        grad_err,
        update_err,
        tol,
        time.perf_counter() - t0,
        problem,
        gen_err=ours["gen_err"],
        gen_tolerance=GEN_TOLERANCE[ours["dtype"]],
        update_tolerance=floor if floor > tol else math.nan,
    )


def generation_row(name: str, loss_type: str, setup: Setup) -> Row:
    """One patched run generating through ``setup.generator`` (engine or server): the generator check only."""
    from slimrl.patching import unpatch

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="slimrl-verify-") as tmp:
        ours, error = _attempt(name, loss_type, setup, True, tmp)
    unpatch()
    gen = ours["gen_err"] if ours else math.nan
    problem = error or ("" if not math.isnan(gen) else "no generated token was checked against the training model")
    if not problem and setup.generator == "server" and not ours["vllm"]:  # switched off on the way: HF generate
        problem = f"the run did not generate through the {setup.generator} (use_vllm was off)"
    return Row(
        name,
        loss_type,
        math.nan,
        math.nan,
        math.nan,
        math.nan,
        time.perf_counter() - t0,
        problem,
        gen_err=gen,
        gen_tolerance=GEN_TOLERANCE_VLLM[setup.dtype],
        generator=setup.generator,
        masked_share=ours["masked"] if ours else math.nan,
    )


def _attempt(name: str, loss_type: str, setup: Setup, patched: bool, out_dir: str, completions: list | None = None):
    """(:func:`_run`'s result, None) or (None, the error in one line); a scenario that cannot run on the setup's
    quantized base raises :class:`~slimrl.verify.scenarios.UnquantizableError`."""
    try:
        with several_chunks() if patched else contextlib.nullcontext():
            return _run(name, loss_type, setup, patched, out_dir, completions), None
    except UnquantizableError:
        raise
    except Exception as err:  # noqa: BLE001  (a crash is reported in the row)
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"


@contextlib.contextmanager
def several_chunks(parts: int = 3):
    """slimrl's automatic chunking split in at least ``parts`` row chunks during a patched run, and the online
    trainers' log-prob passes in micro-batches of a quarter of their sequences: a tiny run's rows fit one chunk (341 at
    SmolLM2's vocabulary) and its batch one forward, so a bug past the first chunk or micro-batch would pass verify
    while the same op is wrong on a real run's thousands of rows. Both change only the order of independent blocks."""
    from slimrl.ops.chunked_logprob import MIN_CHUNKS
    from slimrl.patching.routes.method_capture import MIN_FORWARDS

    # a budget this small splits the shared-prefix layout too: each packed row holds one group's prompt and what
    # fits of it
    chunks, forwards = MIN_CHUNKS.set(parts), MIN_FORWARDS.set(4)
    try:
        yield
    finally:
        MIN_FORWARDS.reset(forwards)
        MIN_CHUNKS.reset(chunks)


def _route_applies(name: str, setup: Setup) -> bool:
    """Whether a log-prob route of slimrl's serves ``name`` here: one of its routes takes a run of the setup's
    config on its device (the fused head, for one, serves no TRL before 1.15 and hands every projection to TRL's
    Triton kernel where that kernel runs and the config chose no chunking of slimrl's: there TRL's kernel is the
    path under test)."""
    from types import SimpleNamespace

    from slimrl.patching.table import every_trainer

    args, device = SimpleNamespace(**setup.slimrl_fields), torch.device(setup.device)
    return any(use.route.takes(args, device) for use in every_trainer()[name].routes)
