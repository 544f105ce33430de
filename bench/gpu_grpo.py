"""One GRPO step of a 1.5-8B model on one GPU: TRL 1.16 alone, TRL + Liger, slimrl, each in its own process.

    python bench/gpu_grpo.py --shape qwen2.5-1.5b --length 4096                     # bf16 LoRA r=64, 3 sides
    python bench/gpu_grpo.py --shape qwen3-8b --quant qlora --generations 8 --length 14336 --sides slimrl
    python bench/gpu_grpo.py --shape qwen2.5-1.5b --fit --cap-gb 24                 # longest length under 24 GB
    python bench/gpu_grpo.py --device cpu --tiny                                    # smoke test of this bench

Models are random-init from the configs in :data:`SHAPES` (nothing downloaded: memory and time do not depend on
the weights' values), saved once under ``--cache`` with a character tokenizer, then loaded by each side its own
way (TRL: ``AutoModelForCausalLM`` + ``GRPOTrainer(peft_config=...)``; slimrl: ``PatchFastRL`` +
``FastLanguageModel``; QLoRA: NF4 base through bitsandbytes on every side). LoRA r=64 (alpha 64) on every
projection; GRPOConfig is TRL's defaults otherwise (dapo, beta 0, gradient checkpointing on, bf16 on CUDA).

Sampling: by default the bench replaces ``generate`` with ``--length`` random token ids per completion (bench code
only), so the training side is what is measured; ``--generate`` keeps HF generate (lengths forced with
``min_new_tokens``). One prompt of ``--prompt-length`` tokens, ``--generations`` completions, one generation batch
per step; ``--steps`` steps, the last one reported.

``slimrl/resident`` is slimrl with GPU-resident checkpointing (``use_gradient_checkpointing=True``) instead of its
default offloaded one: the pair measures the offload's cost in time and its saving in memory. ``slimrl/noshared`` is
slimrl with TRL's row layout in the log-prob passes (``slimrl_shared_prefix=False``: each prompt repeated in its
group's rows); with a long ``--prompt-length`` the pair measures the shared-prefix layout.

Figures per side: peak memory (``torch.cuda.max_memory_allocated`` on CUDA, peak RSS on CPU; weights included),
seconds per step, and with ``--fit`` the longest completion length that fits ``--cap-gb`` (binary search, every
probe its own process; on CUDA the cap is ``torch.cuda.set_per_process_memory_fraction``, an out-of-memory error
means "does not fit"; on CPU a probe fits when its peak RSS is under the cap).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import RESULT_TAG  # noqa: E402 - the bench directory is not a package
from grpo_step import run_worker as run_process  # noqa: E402

SIDES = ("trl", "trl-liger", "slimrl", "slimrl/resident", "slimrl/noshared")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Public model shapes (config.json values that set memory and compute); random weights.
SHAPES: dict[str, dict] = {
    "tiny": dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True,
                 max_position_embeddings=4096),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6),
    "llama-3.2-3b": dict(model_type="llama", hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                         tie_word_embeddings=True, max_position_embeddings=131072, rope_theta=5e5,
                         rms_norm_eps=1e-5),
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     tie_word_embeddings=False, max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6),
}


def model_dir(shape: str, cache: str, device: str) -> str:
    """Random-init ``shape`` saved once (bf16 for CUDA, fp32 for CPU) with a character tokenizer; its path."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from slimrl.verify.tiny import char_tokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    path = os.path.join(cache, f"{shape}-{str(dtype).split('.')[-1]}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    tok = char_tokenizer()
    cfg = AutoConfig.for_model(**SHAPES[shape], pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                               bos_token_id=None)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(path + ".partial")
    tok.save_pretrained(path + ".partial")
    os.replace(path + ".partial", path)
    return path


def replace_sampling(length: int, token_ids: list[int]) -> None:
    """Bench-only: every ``generate`` call returns the prompt followed by ``length`` random ids from ``token_ids``
    (no EOS among them), so every completion has exactly ``length`` tokens."""
    import torch
    from transformers import GenerationMixin

    pool, calls = torch.tensor(token_ids), [0]

    def generate(self, inputs=None, *args, **kwargs):
        ids = kwargs.get("input_ids", inputs)  # [B, P]
        calls[0] += 1
        pick = torch.randint(0, len(pool), (ids.shape[0], length), generator=torch.Generator().manual_seed(calls[0]))
        return torch.cat([ids, pool[pick].to(ids.device)], dim=1)  # [B, P + L]

    GenerationMixin.generate = generate


def _peak_bytes(device: str) -> int:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    from slimrl.compat.memory import peak_bytes

    return peak_bytes(torch.device("cpu"))


def _reward_spread(completions, **kwargs):
    """A number that differs between random completions (their characters' code sum mod 97), so the advantages,
    and the gradient, are not all 0."""
    return [sum(map(ord, c)) % 97 / 97.0 for c in completions]


def worker(args: argparse.Namespace) -> dict:
    """One side in this process: load, build the trainer, run ``--steps`` steps; figures as a dict."""
    import torch

    side = args.worker
    if side == "trl-liger" and (args.device != "cuda" or not _has("liger_kernel")):
        return {"side": side, "skipped": "TRL + Liger needs liger-kernel and a CUDA (Triton) device"}
    if args.quant == "qlora" and (args.device != "cuda" or not _has("bitsandbytes")):
        return {"side": side, "skipped": "QLoRA needs bitsandbytes and a CUDA device"}
    if args.device == "cuda" and args.cap_gb:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gb * 2**30 / total))
    torch.manual_seed(0)
    from datasets import Dataset

    if args.model:
        from slimrl.models.loader import resolve_model_path

        path = str(resolve_model_path(args.model))
    else:
        path = model_dir(args.shape, args.cache, args.device)
    if side.startswith("slimrl"):
        from slimrl import FastLanguageModel, PatchFastRL

        PatchFastRL("grpo", FastLanguageModel)
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
    from trl import GRPOConfig, GRPOTrainer

    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    lora = dict(r=args.lora_r, lora_alpha=args.lora_r, lora_dropout=0.0, target_modules=LORA_TARGETS)
    trainer_kwargs = {}
    if side.startswith("slimrl"):
        model, tok = FastLanguageModel.from_pretrained(path, max_seq_length=args.prompt_length + args.length,
                                                       dtype=dtype, load_in_4bit=args.quant == "qlora")
        ckpt = {"true": True, "false": False}.get(args.ckpt, args.ckpt)
        ckpt = True if side == "slimrl/resident" else ckpt
        model = FastLanguageModel.get_peft_model(model, **lora, use_gradient_checkpointing=ckpt)
    else:
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=dtype) if args.quant == "qlora" else None
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, quantization_config=quant,
                                                     device_map={"": args.device} if quant else None)
        tok = AutoTokenizer.from_pretrained(path)
        trainer_kwargs["peft_config"] = LoraConfig(task_type="CAUSAL_LM", **lora)
    if not args.generate:
        replace_sampling(args.length, [i for i in range(len(tok)) if i not in tok.all_special_ids])
    unit = " a" if len(tok(" a" * 4).input_ids) == 4 else "a"  # one token each: BPE's " a", the char tokenizer's "a"
    prompt = unit * args.prompt_length
    prompt_tokens = len(tok(prompt).input_ids)
    ds = Dataset.from_list([{"prompt": prompt}] * 64)
    cfg = GRPOConfig(
        output_dir="/tmp/slimrl-gpu-bench", per_device_train_batch_size=args.generations,
        num_generations=args.generations, max_completion_length=args.length, max_steps=args.steps,
        generation_kwargs={"min_new_tokens": args.length} if args.generate else {}, report_to="none",
        logging_steps=1, save_strategy="no", seed=0, use_liger_kernel=side == "trl-liger",
        **({"slimrl_shared_prefix": False} if side == "slimrl/noshared" else {}),
        **({"gradient_checkpointing": False} if args.ckpt == "false" else {}),
        **({"bf16": True} if args.device == "cuda" else {"bf16": False, "use_cpu": True}),
    )
    trainer = GRPOTrainer(model=model, args=cfg, reward_funcs=[_reward_spread], train_dataset=ds,
                          processing_class=tok, **trainer_kwargs)
    step_s: list[float] = []
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if args.device == "cuda":
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            if args.device == "cuda":
                torch.cuda.synchronize()
            step_s.append(time.perf_counter() - self.t0)

    trainer.add_callback(Timer())
    try:
        trainer.train()
    except torch.OutOfMemoryError as exc:
        return {"side": side, "fits": False, "oom": str(exc).splitlines()[0], "length": args.length}
    peak = _peak_bytes(args.device)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "side": side, "length": args.length, "prompt_tokens": prompt_tokens, "peak_gb": peak / 2**30,
        "peak_bytes": peak, "step_s": step_s,
        "fits": not args.cap_gb or peak <= args.cap_gb * 2**30, "loss": logs[-1]["loss"] if logs else None,
        "grad_norm": logs[-1].get("grad_norm") if logs else None,
        "completion_len": logs[-1].get("completions/mean_length") if logs else None,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
    }


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run_worker(args: argparse.Namespace, side: str, length: int) -> dict:
    """``side`` at completion length ``length`` in its own process; its result dict."""
    cmd = [sys.executable, __file__, "--worker", side, "--length", str(length)]
    for name in ("shape", "quant", "generations", "prompt_length", "steps", "device", "cache", "cap_gb", "model",
                 "lora_r", "ckpt"):
        value = getattr(args, name)
        if value is not None:
            cmd += [f"--{name.replace('_', '-')}", str(value)]
    cmd += ["--generate"] if args.generate else []
    return run_process(cmd, f"{side} at length {length}")


def longest_fitting(fits: Callable[[int], bool], lo: int, hi: int, step: int) -> int | None:
    """The largest multiple of ``step`` in ``[lo, hi]`` with ``fits(length)`` true, by binary search (``fits`` is
    assumed monotone: a longer completion never takes less memory); None when even ``lo`` does not fit."""
    lo_k, hi_k = math.ceil(lo / step), hi // step
    best = None
    while lo_k <= hi_k:
        mid = (lo_k + hi_k) // 2
        if fits(mid * step):
            best, lo_k = mid * step, mid + 1
        else:
            hi_k = mid - 1
    return best


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    ap.add_argument("--tiny", action="store_true", help="the tiny shape, short lengths (smoke test)")
    ap.add_argument("--model", default=None, help="a real model (path, hub id in the cache or the alias) instead of "
                                                  "a random-init shape")
    ap.add_argument("--lora-r", type=int, default=64)
    ap.add_argument("--ckpt", choices=["slimrl", "selective", "true", "false"], default="slimrl",
                    help="slimrl's use_gradient_checkpointing (slimrl sides); false also turns TRL's off")
    ap.add_argument("--quant", choices=["bf16", "qlora"], default="bf16")
    ap.add_argument("--sides", default=",".join(SIDES[:3]))
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--length", type=int, default=None, help="completion tokens (2048; 16 with --tiny)")
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--cache", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "slimrl-gpu-models"))
    ap.add_argument("--generate", action="store_true", help="keep HF generate (forced lengths)")
    ap.add_argument("--fit", action="store_true", help="longest completion length that fits --cap-gb")
    ap.add_argument("--cap-gb", type=float, default=None)
    ap.add_argument("--fit-range", default="256:32768", help="lo:hi lengths searched by --fit")
    ap.add_argument("--fit-step", type=int, default=256)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.tiny:
        args.shape = "tiny"
    if args.length is None:
        args.length = 16 if args.shape == "tiny" else 2048
    if args.worker:
        print(RESULT_TAG + json.dumps(worker(args)), flush=True)
        return {}
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device here; use --device cpu (with --tiny for a smoke test)")
    if args.fit and not args.cap_gb:
        raise SystemExit("--fit needs --cap-gb (the memory cap, e.g. --cap-gb 24)")
    sides = args.sides.split(",")
    unknown = set(sides) - set(SIDES)
    if unknown:
        raise SystemExit(f"--sides: unknown {sorted(unknown)}; choose from {', '.join(SIDES)}")
    if not args.model:
        model_dir(args.shape, args.cache, args.device)  # built once, before the sides run
    results: dict[str, dict] = {}
    for side in sides:
        if args.fit:
            lo, hi = (int(x) for x in args.fit_range.split(":"))
            probes: dict[int, dict] = {}

            def fits(length: int, side: str = side, probes: dict = probes) -> bool:
                probes[length] = run_worker(args, side, length)
                return bool(probes[length].get("fits"))

            best = longest_fitting(fits, lo, hi, args.fit_step)
            skipped = next((p["skipped"] for p in probes.values() if "skipped" in p), None)
            results[side] = {"side": side, "longest_fit": best, "probes": probes, **({"skipped": skipped}
                                                                                     if skipped else {})}
        else:
            results[side] = run_worker(args, side, args.length)
    _print(args, results)
    print(RESULT_TAG + json.dumps(results))
    return results


def _print(args: argparse.Namespace, results: dict[str, dict]) -> None:
    base_dtype = "NF4" if args.quant == "qlora" else "bf16" if args.device == "cuda" else "fp32"
    print(f"GRPO step, {args.shape} ({base_dtype} base, LoRA r=64), {args.generations} x "
          f"{'fit under ' + str(args.cap_gb) + ' GB' if args.fit else args.length} tokens, "
          f"{'HF generate' if args.generate else 'random completions'}, device {args.device}")
    base = results.get("trl", {})
    for side, r in results.items():
        if "skipped" in r:
            print(f"{side:10} skipped: {r['skipped']}")
        elif args.fit:
            ratio = (f"  {r['longest_fit'] / base['longest_fit']:.2f}x trl" if side != "trl" and r["longest_fit"]
                     and base.get("longest_fit") else "")
            print(f"{side:10} longest completion that fits: {r['longest_fit']}{ratio}")
        elif not r.get("fits", True) and "oom" in r:
            print(f"{side:10} out of memory: {r['oom']}")
        else:
            line = f"{side:10} peak {r['peak_gb']:7.2f} GB  {r['step_s'][-1]:8.2f} s/step  loss {r['loss']}"
            if side != "trl" and "peak_gb" in base:
                line += (f"  (memory {r['peak_gb'] / base['peak_gb']:.2f}x, "
                         f"time {r['step_s'][-1] / base['step_s'][-1]:.2f}x trl)")
            print(line)


if __name__ == "__main__":
    main()
