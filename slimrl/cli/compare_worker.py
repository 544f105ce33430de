"""One side of ``slimrl compare`` (and of the GPU runner's ``bench/gpu_grpo.py``) in this process: load the model
the side's own way, build its GRPOTrainer, run the steps, print the figures as one JSON line after
:data:`RESULT_TAG` (``python -m slimrl.cli.compare_worker --worker SIDE --model DIR ...``).

Sides: ``trl`` (``AutoModelForCausalLM`` + ``GRPOTrainer(peft_config=...)``), ``trl-liger`` (the same with
``use_liger_kernel=True``), ``slimrl`` (``PatchFastRL`` + ``FastLanguageModel``), ``slimrl/resident`` (GPU-resident
checkpointing instead of slimrl's offloaded one), ``slimrl/noshared`` (TRL's row layout in the log-prob passes),
``slimrl/untiled`` (whole MLPs, whatever the lean default would choose) and
``unsloth`` (Unsloth as its notebooks use it: ``from unsloth import FastLanguageModel, PatchFastRL`` first,
``PatchFastRL("GRPO", FastLanguageModel)``, ``FastLanguageModel.from_pretrained(..., fast_inference=False)`` and
``get_peft_model(..., use_gradient_checkpointing="unsloth")``, on its own TRL 1.15 from the folder
:data:`UNSLOTH_SITE`, which the parent puts first on this process's path).

Per step: wall seconds and, on CUDA, the step's peak of ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` (reset at each step's start; on the CPU the process's peak RSS so far). ``--lengths a,b,..``
gives each step its own completion length (the linear fit measures two lengths in one process); the second step
carries the optimizer's state, which the first step's peak lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import types

RESULT_TAG = "BENCH_RESULT "  # the one line a worker prints its figures on
UNSLOTH_SITE = os.environ.get("SLIMRL_UNSLOTH_SITE", "/tmp/slimrl-unsloth-site")
# the rehearsal's view of the GPU machine's packages (bench/gpu_unsloth.py --view): set, an Unsloth process runs
# with ``python -S`` and sees that folder's packages and its own, nothing else of this interpreter's
UNSLOTH_VIEW = os.environ.get("SLIMRL_UNSLOTH_VIEW")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def unsloth_env(device: str) -> dict[str, str]:
    """The environment of an Unsloth worker: its folder first on the path, and nothing that reaches a network
    (Unsloth's usage statistics and the hub off); on the CPU (the rehearsal) Unsloth's own CPU switch."""
    env = dict(os.environ)
    rest = UNSLOTH_VIEW if UNSLOTH_VIEW else env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (UNSLOTH_SITE, rest) if p)
    env.update(
        UNSLOTH_DISABLE_STATISTICS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        UNSLOTH_COMPILE_LOCATION=os.path.join(os.environ.get("TMPDIR", "/tmp"), "slimrl-unsloth-compiled"),
    )
    if device == "cpu":
        env["UNSLOTH_ALLOW_CPU"] = "1"
    return env


def unsloth_python() -> list[str]:
    """The interpreter command of an Unsloth process (``-S`` in the rehearsal: the machine view instead of this
    interpreter's site-packages)."""
    import sys

    return [sys.executable, "-S"] if UNSLOTH_VIEW else [sys.executable]


def fake_generate(lengths: list[int], token_ids: list[int]):
    """Bench-only ``generate``: the prompt followed by random ids from ``token_ids`` (no EOS among them), the n-th
    call's completions ``lengths[n]`` tokens long (the last length repeats)."""
    import torch

    pool, calls = torch.tensor(token_ids), [0]

    def generate(self, inputs=None, *args, **kwargs):
        ids = kwargs.get("input_ids", inputs)  # [B, P]
        length = lengths[min(calls[0], len(lengths) - 1)]
        calls[0] += 1
        pick = torch.randint(0, len(pool), (ids.shape[0], length), generator=torch.Generator().manual_seed(calls[0]))
        return torch.cat([ids, pool[pick].to(ids.device)], dim=1)  # [B, P + L]

    return generate


def install_generate(model, generate) -> None:
    """``generate`` on transformers' mixin and on every object of the model's wrapper chain (PEFT, Unsloth and the
    trainer call it through different ones)."""
    from transformers import GenerationMixin

    GenerationMixin.generate = generate
    todo, seen = [model], set()
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if hasattr(obj, "generate"):
            obj.generate = types.MethodType(generate, obj)
        todo += [getattr(obj, "base_model", None), getattr(obj, "model", None)]


def _reward_spread(completions, **kwargs):
    """A number that differs between random completions (their characters' code sum mod 97), so the advantages,
    and the gradient, are not all 0."""
    return [sum(map(ord, c)) % 97 / 97.0 for c in completions]


def _skip(args) -> str | None:
    from importlib.util import find_spec

    side = args.worker
    if side == "trl-liger" and (args.device != "cuda" or find_spec("liger_kernel") is None):
        return "TRL + Liger needs liger-kernel and a CUDA (Triton) device"
    if args.quant == "qlora" and (args.device != "cuda" or find_spec("bitsandbytes") is None):
        return "QLoRA needs bitsandbytes and a CUDA device"
    if side == "unsloth" and find_spec("unsloth") is None:
        return f"Unsloth is not installed in {UNSLOTH_SITE} (bench/gpu_run.py B installs it)"
    return None


def _load(args, path: str, dtype):
    """(model, tokenizer, extra GRPOTrainer kwargs) the side's own way."""
    side, qlora = args.worker, args.quant == "qlora"
    lora = dict(r=args.lora_r, lora_alpha=args.lora_r, lora_dropout=0.0, target_modules=LORA_TARGETS)
    seq = args.prompt_length + max(args.lengths)
    if side == "unsloth":
        from unsloth import FastLanguageModel

        model, tok = FastLanguageModel.from_pretrained(
            model_name=path, max_seq_length=seq, dtype=dtype, load_in_4bit=qlora, fast_inference=False
        )
        model = FastLanguageModel.get_peft_model(
            model, **lora, bias="none", use_gradient_checkpointing="unsloth", random_state=3407
        )
        return model, tok, {}
    if side.startswith("slimrl"):
        from slimrl import FastLanguageModel

        tiles = {"unsloth_tiled_mlp": False} if side == "slimrl/untiled" else {}
        model, tok = FastLanguageModel.from_pretrained(
            path, max_seq_length=seq, dtype=dtype, load_in_4bit=qlora, **tiles
        )
        ckpt = True if side == "slimrl/resident" else {"true": True, "false": False}.get(args.ckpt, args.ckpt)
        return FastLanguageModel.get_peft_model(model, **lora, use_gradient_checkpointing=ckpt), tok, {}
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    quant = (
        BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=dtype
        )
        if qlora
        else None
    )
    from peft import get_peft_model

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, quantization_config=quant, device_map={"": args.device} if quant else None
    )
    torch.manual_seed(3407)  # the adapter initialised as FastLanguageModel.get_peft_model's random_state does it
    model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
    return model, AutoTokenizer.from_pretrained(path), {}


def _versions(side: str) -> dict[str, str | None]:
    from importlib import metadata

    names = ("torch", "transformers", "trl", "peft") + (
        ("unsloth", "unsloth_zoo")
        if side == "unsloth"
        else ("slimrl",)
        if side.startswith("slimrl")
        else ("liger_kernel",)
        if side == "trl-liger"
        else ()
    )
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def run_side(args, path: str) -> dict:
    """One side in this process (module docstring); its figures."""
    side = args.worker
    skipped = _skip(args)
    if skipped:
        return {"side": side, "skipped": skipped}
    if side == "unsloth":
        import unsloth  # noqa: F401 - first, before transformers and TRL, as Unsloth requires
        from unsloth import FastLanguageModel, PatchFastRL

        PatchFastRL("GRPO", FastLanguageModel)
        if args.device != "cuda":  # the rehearsal: Unsloth imports and patches on the CPU, but loads on CUDA only
            return {
                "side": side,
                "skipped": "Unsloth loads a model on a CUDA device only (rehearsed here: import unsloth, PatchFastRL)",
                "rehearsed": True,
                "versions": _versions(side),
            }
    elif side.startswith("slimrl"):
        from slimrl import FastLanguageModel, PatchFastRL

        PatchFastRL("grpo", FastLanguageModel)
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cuda = args.device == "cuda"
    if cuda and args.cap_gb:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gb * 2**30 / total))
    torch.manual_seed(0)
    dtype = torch.bfloat16 if cuda else torch.float32
    try:
        model, tok, extra = _load(args, path, dtype)
    except Exception as exc:  # noqa: BLE001 - an out-of-memory load is a figure; anything else is reported
        from slimrl.compat.runtime.allocation_errors import ran_out_of_memory  # here: an Unsloth side imports it first

        if ran_out_of_memory(exc):
            return {"side": side, "fits": False, "oom": str(exc).splitlines()[0], "lengths": args.lengths}
        raise
    unit = " a" if len(tok(" a" * 4).input_ids) == 4 else "a"  # one token each: BPE's " a", the char tokenizer's "a"
    prompt = unit * args.prompt_length
    cfg = GRPOConfig(
        output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), f"slimrl-gpu-bench-{side.replace('/', '-')}"),
        per_device_train_batch_size=args.generations,
        gradient_accumulation_steps=1,
        num_generations=args.generations,
        max_completion_length=max(args.lengths),
        max_steps=args.steps,
        generation_kwargs={"min_new_tokens": args.lengths[0]} if args.generate else {},
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
        learning_rate=1e-5,
        use_liger_kernel=side == "trl-liger",
        **({"slimrl_shared_prefix": False} if side == "slimrl/noshared" else {}),
        **({"gradient_checkpointing": False} if args.ckpt == "false" else {}),
        **({"bf16": True} if cuda else {"bf16": False, "use_cpu": True}),
    )
    trainer = GRPOTrainer(
        model=model,
        args=cfg,
        reward_funcs=[_reward_spread],
        train_dataset=Dataset.from_list([{"prompt": prompt}] * 64),
        processing_class=tok,
        **extra,
    )
    if not args.generate:
        install_generate(
            trainer.model, fake_generate(args.lengths, [i for i in range(len(tok)) if i not in tok.all_special_ids])
        )
    steps: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - self.t0
            alloc, reserved = _peaks(cuda)
            steps.append(
                {
                    "length": args.lengths[min(len(steps), len(args.lengths) - 1)],
                    "s": seconds,
                    "alloc_gb": alloc / 2**30,
                    "reserved_gb": reserved / 2**30,
                }
            )

    trainer.add_callback(Timer())
    try:
        trainer.train()
    except Exception as exc:  # noqa: BLE001
        from slimrl.compat.runtime.allocation_errors import ran_out_of_memory

        if not ran_out_of_memory(exc):
            raise
        return {"side": side, "fits": False, "oom": str(exc).splitlines()[0], "lengths": args.lengths, "steps": steps}
    logs = [h for h in trainer.state.log_history if "loss" in h]
    last = steps[-1] if steps else {}
    return {
        "side": side,
        "length": last.get("length"),
        "prompt_tokens": len(tok(prompt).input_ids),
        "steps": steps,
        "peak_gb": max((s["alloc_gb"] for s in steps), default=0.0),
        "peak_bytes": int(max((s["alloc_gb"] for s in steps), default=0.0) * 2**30),
        "reserved_gb": max((s["reserved_gb"] for s in steps), default=0.0),
        "step_s": [s["s"] for s in steps],
        "fits": not args.cap_gb
        or max((s["reserved_gb"] if cuda else s["alloc_gb"] for s in steps), default=0.0) <= args.cap_gb,
        "loss": logs[-1]["loss"] if logs else None,
        "grad_norm": logs[-1].get("grad_norm") if logs else None,
        "first_loss": logs[0]["loss"] if logs else None,
        "first_grad_norm": logs[0].get("grad_norm") if logs else None,
        "completion_len": logs[-1].get("completions/mean_length") if logs else None,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "versions": _versions(side),
    }


def _peaks(cuda: bool) -> tuple[int, int]:
    """(allocated, reserved) peak bytes of the step on CUDA; on the CPU the process's peak RSS twice."""
    import torch

    if cuda:
        return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    from slimrl.compat.memory import peak_bytes

    peak = peak_bytes(torch.device("cpu"))
    return peak, peak


def worker_parser() -> argparse.ArgumentParser:
    """A worker's options (what ``slimrl compare`` and ``bench/gpu_grpo.py`` pass)."""
    p = argparse.ArgumentParser(prog="python -m slimrl.cli.compare_worker")
    p.add_argument("--worker", required=True)
    p.add_argument("--model", required=True, help="the model directory")
    p.add_argument("--lengths", required=True, help="completion tokens of each step, comma-separated")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--lora-r", type=int, default=64)
    p.add_argument("--ckpt", default="slimrl")
    p.add_argument("--quant", default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cap-gb", type=float, default=None)
    p.add_argument("--generate", action="store_true")
    return p


if __name__ == "__main__":
    arguments = worker_parser().parse_args()
    arguments.lengths = [int(x) for x in arguments.lengths.split(",")]
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # the side's warnings go in its record (a GPU run's clues)
        warnings.simplefilter("default")
        figures = run_side(arguments, arguments.model)
    figures["warnings"] = sorted({str(w.message)[:300] for w in caught})[:20]
    print(RESULT_TAG + json.dumps(figures), flush=True)
