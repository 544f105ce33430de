"""``slimrl verify`` / ``slimrl.verify(...)``: prove on your own setup that the patch is exact.

For each trainer the installed TRL has (or the ones asked for) and each of its loss types, the same small training
run (:mod:`slimrl.verify.scenarios`: two SGD steps from one seed) is done twice in this process, first with TRL
alone (``unpatch``), then with slimrl patched, on a tiny random model built from your model's config (same
architecture, vocabulary, head tying and soft-capping; 2 layers, narrow; :mod:`slimrl.verify.tiny`) or on the real
model (``full=True``). Compared, as relative errors ``|a - b| / |b|`` (L2 norms): the logged losses (worst step),
the gradient of every parameter at the first step (worst parameter), and the whole update after the two steps (all
trainable parameters as one vector: step two's gradient is taken at slightly different weights, so a parameter whose
two steps nearly cancel would magnify rounding in a per-parameter ratio). A row passes when all three are within the
tolerance the project's own parity tests use. GRPO also gets the agentic rows ``tools``, ``environment`` and
``rollout_func`` (:mod:`slimrl.verify.agentic`: scripted multi-turn rollouts, the same on both sides). For GRPO and
RLOO the patched run also checks that the generator
sampled from the model being trained (:mod:`slimrl.verify.generation`: the largest difference between the log-prob
the generator gave a sampled token and the training model's, within :data:`GEN_TOLERANCE`).

``fast_inference=True`` / ``vllm_server_base_url=URL`` add, for GRPO and RLOO, a row whose patched run generates
through slimrl's colocated vLLM engine (the tiny model saved and loaded with ``FastLanguageModel(...,
fast_inference=True)``) or a running vLLM server (the model in ``model``, a local directory the server serves): TRL
alone cannot generate the same samples there, so those rows check the generator only.

``load_in_4bit=True`` (``load_in_8bit``) runs the LoRA scenarios (GRPO, RLOO, OnlineDPO, XPO) on a base quantized by
bitsandbytes the way users load one (on the CPU with bitsandbytes >= 0.50, or CUDA); each step generates before the
compared backward, so a quantized layer that generation leaves without a gradient fails the row.
"""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slimrl.verify.agentic import KINDS as AGENTIC
from slimrl.verify.compare import joint_error, loss_error, worst_parameter_error
from slimrl.verify.reference import trl_kernel_where_missing
from slimrl.verify.scenarios import Kit, Setup, UnquantizableError, loss_types

PROBED = ("grpo", "rloo")  # trainers whose generation is checked against the training model

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


class VerifyError(ValueError):
    """Bad input to ``slimrl verify`` (one line naming the option and the fix)."""


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

    @property
    def passed(self) -> bool:
        generation_ok = math.isnan(self.gen_err) or self.gen_err <= self.gen_tolerance
        if self.generator != "hf":
            return not self.problem and math.isfinite(self.gen_err) and generation_ok
        update_tol = max(self.tolerance, 0.0 if math.isnan(self.update_tolerance) else self.update_tolerance)
        worst = max(self.loss_err, self.grad_err)
        return not self.skipped and not self.problem and math.isfinite(worst) and worst <= self.tolerance \
            and math.isfinite(self.update_err) and self.update_err <= update_tol and generation_ok

    @property
    def failed(self) -> bool:
        return not self.skipped and not self.passed


def _run(name: str, loss_type: str, setup: Setup, patched: bool, out_dir: str) -> dict[str, Any]:
    """One side: build the trainer (patch state set first), train two steps, return losses, first-step gradients,
    updates and whether slimrl's log-prob path ran."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from slimrl.patching import TRAINERS, PatchFastRL, trainer_and_config, unpatch
    from slimrl.patching.routes import served
    from slimrl.verify.generation import GenerationProbe, worst_difference

    unpatch()
    if patched:
        PatchFastRL(name)
    trainer_cls, config_cls = trainer_and_config(name)
    torch.manual_seed(0)
    trainer = TRAINERS[name].scenario(Kit(trainer_cls, config_cls, out_dir, setup), loss_type)
    model = trainer.model
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in params.items()}
    grads: dict[str, torch.Tensor] = {}

    class FirstGradients(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if not grads:
                grads.update({n: p.grad.detach().clone() for n, p in params.items() if p.grad is not None})

    probe = GenerationProbe(trainer) if patched and name in PROBED and loss_type not in AGENTIC else None
    trainer.add_callback(FirstGradients())
    trainer.remove_callback(PrinterCallback)  # the table is the output, not TRL's log dictionaries
    trainer.train()
    if probe is not None:
        probe.remove()
    return {"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "gen_err": worst_difference(probe, trainer.state.log_history) if patched else math.nan,
            "grads": grads, "updates": {n: p.detach() - before[n] for n, p in params.items()},
            "used": served(trainer) > 0, "vllm": bool(getattr(trainer, "use_vllm", False)),
            "exposure": rounding_exposure(params, {n: p.detach() - before[n] for n, p in params.items()}),
            "dtype": _lowest_precision(p.dtype for p in params.values())}


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
    """The least precise floating dtype the trained parameters have (TRL keeps a QLoRA adapter in bf16)."""
    order = [torch.bfloat16, torch.float16, torch.float32]
    found = set(dtypes)
    return next((d for d in order if d in found), torch.float32)


def compare(name: str, loss_type: str, setup: Setup) -> Row:
    """One row: TRL alone vs patched (see the module docstring)."""
    from slimrl.patching import unpatch

    tol = TOLERANCE[setup.dtype]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="slimrl-verify-") as tmp:
        with trl_kernel_where_missing():  # TRL 1.15 without Triton has no fused-head kernel: a plain one stands in
            ref, ref_error = _attempt(name, loss_type, setup, False, str(Path(tmp) / "trl"))
        ours, our_error = _attempt(name, loss_type, setup, True, str(Path(tmp) / "slimrl"))
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
    from slimrl.patching.specs import TRAINERS

    uses_ops = bool(TRAINERS[name].routes)
    if not problem and uses_ops and not ours["used"] and _route_applies(name):
        problem = "slimrl's log-prob path did not run"
    if not problem and name in PROBED and loss_type not in AGENTIC and math.isnan(ours["gen_err"]):
        problem = "no generated token was checked against the training model"
    # the generator computes in the trained parameters' precision too (a QLoRA adapter's bf16 branch): on a CPU with
    # native bf16 dot products (AVX512-BF16) one decoding row and the scored batch round differently at that level
    return Row(name, loss_type, loss_err, grad_err, update_err, tol, time.perf_counter() - t0, problem,
               gen_err=ours["gen_err"], gen_tolerance=GEN_TOLERANCE[ours["dtype"]],
               update_tolerance=floor if floor > tol else math.nan)


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
    return Row(name, loss_type, math.nan, math.nan, math.nan, math.nan, time.perf_counter() - t0, problem,
               gen_err=gen, gen_tolerance=GEN_TOLERANCE_VLLM[setup.dtype], generator=setup.generator)


def _attempt(name: str, loss_type: str, setup: Setup, patched: bool, out_dir: str):
    """(:func:`_run`'s result, None) or (None, the error in one line); a scenario that cannot run on the setup's
    quantized base raises :class:`~slimrl.verify.scenarios.UnquantizableError`."""
    try:
        return _run(name, loss_type, setup, patched, out_dir), None
    except UnquantizableError:
        raise
    except Exception as err:  # noqa: BLE001  (a crash is reported in the row)
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"


def _route_applies(name: str) -> bool:
    """Whether a log-prob route serves ``name`` on the installed TRL (DPO/KTO/SFT before 1.15 have none)."""
    from slimrl.compat.trl_info import has_fused_head

    return not (name in ("dpo", "kto", "sft") and not has_fused_head())


def make_setup(model: str | None = None, full: bool = False, device: str = "cpu", quantized: str | None = None
               ) -> Setup:
    """The model config, tokenizer, device, dtype and quantization the rows run with (see :func:`verify`)."""
    from slimrl.verify.tiny import char_tokenizer, default_config, shrink

    if device not in ("cpu", "cuda"):
        raise VerifyError(f"--device {device}: use cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise VerifyError("--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False); "
                          "use --device cpu")
    if quantized is not None:
        _check_bitsandbytes(quantized, device)
    if full and model is None:
        model = "SmolLM2-135M-Instruct"
    if model is None:
        config, tokenizer = default_config(), char_tokenizer()
    else:
        from transformers import AutoConfig, AutoTokenizer

        from slimrl.models.loader import resolve_model_path

        try:
            path = resolve_model_path(model)
        except (FileNotFoundError, ValueError) as err:
            raise VerifyError(str(err).splitlines()[0]) from None
        try:
            if path.is_file():  # a .gguf: its metadata holds the config and the tokenizer
                config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
                tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
            else:
                config = AutoConfig.from_pretrained(str(path))
                tokenizer = AutoTokenizer.from_pretrained(str(path))
        except Exception as err:  # noqa: BLE001 - transformers' and gguf's own errors, in one line
            first = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
            raise VerifyError(f"--model {model}: its config or tokenizer cannot be read ({type(err).__name__}: "
                              f"{first[:200]}); pass a model directory with a valid config.json") from None
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if not full:
            config = shrink(config)
    dtype = torch.float32
    if device == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return Setup(config=config, tokenizer=tokenizer, device=device, dtype=dtype, quantized=quantized)


def _check_bitsandbytes(quantized: str, device: str) -> None:
    """``--load_in_4bit`` / ``--load_in_8bit`` can run on ``device``: bitsandbytes importable, >= 0.50 on a CPU."""
    from slimrl.compat.quant import BNB_CPU_MIN

    flag = f"--load_in_{quantized}"
    try:
        import bitsandbytes
    except ImportError:
        raise VerifyError(f"{flag}: bitsandbytes is not installed; pip install 'slimrl[quant]'") from None
    from packaging.version import Version

    if device == "cpu" and Version(bitsandbytes.__version__) < Version(BNB_CPU_MIN):
        raise VerifyError(f"{flag}: bitsandbytes {bitsandbytes.__version__} has no CPU backend; pip install "
                          f"'bitsandbytes>={BNB_CPU_MIN}' or pass --device cuda")


def verify(algorithms: list[str] | None = None, loss_type: str | None = None, model: str | None = None,
           full: bool = False, device: str = "cpu", progress=None, load_in_4bit: bool = False,
           load_in_8bit: bool = False, fast_inference: bool = False, vllm_server_base_url: str | None = None
           ) -> list[Row]:
    """Rows for every (trainer, loss type) asked for (default: every trainer the installed TRL has). ``model``: a
    model directory, .gguf or hub id whose config the tiny model copies (``full=True``: the model itself);
    ``device``: "cpu" (fp32) or "cuda" (bf16); ``load_in_4bit`` / ``load_in_8bit``: a bitsandbytes-quantized base
    (the LoRA scenarios only); ``fast_inference`` / ``vllm_server_base_url``: also the generator rows of GRPO and
    RLOO (see the module docstring). ``progress(row)`` is called after each row."""
    import datasets

    from slimrl.patching import TRAINERS, _normalise, trainer_and_config, trainer_available

    datasets.disable_progress_bars()
    if load_in_4bit and load_in_8bit:
        raise VerifyError("--load_in_4bit and --load_in_8bit: pass one of them")
    quantized = "4bit" if load_in_4bit else "8bit" if load_in_8bit else None
    names = [n for n in TRAINERS if trainer_available(n) and TRAINERS[n].scenario] if not algorithms else \
        [_checked_name(a, _normalise, trainer_available, TRAINERS) for a in algorithms]
    if vllm_server_base_url is not None and (model is None or not Path(model).is_dir()):
        raise VerifyError("--vllm_server_base_url: pass --model DIR, the local model directory the server serves "
                          "(the trained model must hold the server's weights)")
    if vllm_server_base_url is not None:
        from slimrl.verify.server_check import server_problem

        problem = server_problem(vllm_server_base_url)
        if problem:
            raise VerifyError(f"--vllm_server_base_url: {problem}")
    if fast_inference:
        from slimrl.generation import vllm_status

        if vllm_status() is not None:
            raise VerifyError(f"--fast_inference: {vllm_status()}")
    setup = make_setup(model, full, device, quantized)
    rows = []
    for name in names:
        types = loss_types(name, trainer_and_config(name)[1])
        if loss_type is not None:
            if loss_type not in types:
                raise VerifyError(f"--loss_type {loss_type}: {name} has {', '.join(types)}")
            types = [loss_type]
        for lt in types:
            try:
                row = compare(name, lt, setup)
            except UnquantizableError as err:  # before any compute: the scenario's first model
                if algorithms:
                    raise VerifyError(f"--load_in_{quantized}: {name}: {err}; the LoRA trainers' rows run on a "
                                      f"quantized base") from None
                break
            rows.append(row)
            if progress is not None:
                progress(row)
    for row in _generator_rows([n for n in names if n in PROBED], loss_type, setup, fast_inference,
                               vllm_server_base_url, model):
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def _generator_rows(names: list[str], loss_type: str | None, setup: Setup, fast_inference: bool,
                    server_url: str | None, model: str | None):
    """The engine and server rows (one per trainer: ``loss_type`` if it has it, else its first), made lazily."""
    import dataclasses

    from slimrl.patching import trainer_and_config

    wanted = (["engine"] if fast_inference else []) + (["server"] if server_url else [])
    for generator in wanted:
        with tempfile.TemporaryDirectory(prefix="slimrl-verify-weights-") as tmp:
            weights = model if generator == "server" else _save_tiny(setup, tmp)
            # three steps, each generating (one iteration per generation): steps two and three sample after an
            # update, so a generator that missed the adapter sync fails
            gen_setup = dataclasses.replace(setup, generator=generator, weights=weights, server_url=server_url,
                                            overrides={"max_steps": 3, "num_iterations": 1})
            for name in names:
                types = loss_types(name, trainer_and_config(name)[1])
                yield generation_row(name, loss_type if loss_type in types else types[0], gen_setup)


def _save_tiny(setup: Setup, directory: str) -> str:
    """The scenarios' tiny model (seed 0) and tokenizer written to ``directory`` for the engine to load, with
    attention heads of 32 (vLLM's CPU attention has no kernel for smaller heads)."""
    import copy

    from slimrl.verify.tiny import build

    config = copy.deepcopy(setup.config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = max(1, text.hidden_size // 32)
    text.num_attention_heads = heads
    if getattr(text, "num_key_value_heads", None) is not None:
        text.num_key_value_heads = heads
    if getattr(text, "head_dim", None) is not None:
        text.head_dim = text.hidden_size // heads
    build(config, 0, dtype=setup.dtype).save_pretrained(directory)
    setup.tokenizer.save_pretrained(directory)
    return directory


def _checked_name(algorithm: str, normalise, available, trainers: dict) -> str:
    try:
        name = normalise(algorithm)
    except ValueError as err:
        raise VerifyError(f"--algorithm {algorithm}: {err}") from None
    if trainers[name].scenario is None:
        verifiable = [n for n, spec in trainers.items() if spec.scenario]
        raise VerifyError(f"--algorithm {algorithm}: not verified ({trainers[name].not_verified}); "
                          f"verifiable: {', '.join(verifiable)}")
    if not available(name):
        raise VerifyError(f"--algorithm {algorithm}: the installed TRL has no such trainer")
    return name


def _fmt_tol(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.0e}"


def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else "inf" if math.isinf(x) else f"{x:.1e}"


def format_table(rows: list[Row], setup_line: str = "") -> str:
    """The table ``slimrl verify`` prints, with the tolerance reasons under it."""
    head = ("trainer", "loss type", "loss rel.err", "grad rel.err", "update rel.err", "tolerance", "gen logp diff",
            "result")
    body = [(r.trainer, r.loss_type, _fmt(r.loss_err), _fmt(r.grad_err), _fmt(r.update_err),
             _fmt_tol(r.tolerance) + ("" if math.isnan(r.update_tolerance) else f", update {r.update_tolerance:.0e}"),
             "-" if math.isnan(r.gen_err) else f"{_fmt(r.gen_err)} (<= {r.gen_tolerance:.0e})" +
             ("" if r.generator == "hf" else f" {r.generator}"),
             "PASS" if r.passed else f"SKIP ({r.skipped})" if r.skipped else
             "FAIL" + (f" ({r.problem})" if r.problem else "")) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)) for b in body]
    reasons = {r.tolerance for r in rows}
    for dtype, tol in TOLERANCE.items():
        if tol in reasons:
            lines.append(f"tolerance {tol:.0e}: {REASON[dtype]}")
    if any(not math.isnan(r.update_tolerance) for r in rows):
        lines.append("update (a row's own tolerance): its weights are stored in 16 bits and each step rounds them to "
                     "the dtype's spacing s; gradients that differ by the tolerance t round element i differently "
                     "with probability ~ t|u_i|/s_i, so the update is measured only to 3 sqrt(t sum |u_i| s_i) / "
                     "||u|| (u: TRL's update)")
    gen = {r.gen_tolerance for r in rows if not math.isnan(r.gen_err) and r.generator == "hf"}
    vllm = {r.gen_tolerance for r in rows if r.generator != "hf"}
    for tol in sorted(vllm):
        lines.append(f"gen logp diff, engine/server rows (patched run only: TRL alone cannot draw the same samples "
                     f"there): {tol:.0e}: {GEN_REASON_VLLM}")
    for dtype, tol in GEN_TOLERANCE.items():
        if tol in gen:
            lines.append(f"gen logp diff: largest |log p| difference of a sampled token between the generator and "
                         f"the training model; {tol:.0e}: {GEN_REASON[dtype]}")
    if setup_line:
        lines.insert(0, setup_line)
    return "\n".join(lines)


__all__ = ["verify", "format_table", "compare", "make_setup", "Row", "VerifyError", "TOLERANCE", "GEN_TOLERANCE"]
