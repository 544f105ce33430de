"""Generation speed on the real SmolLM2-135M with a LoRA adapter: slimrl's engine vs HF generate, each in its own
process.

    PYTHONPATH=. .venv-vllm/bin/python bench/generation.py --generations 8 --length 512

* ``hf``: HF ``generate`` under ``FastLanguageModel.for_inference`` (what TRL alone and slimrl without vLLM use),
  sampling, ``min_new_tokens`` = ``max_new_tokens`` = ``--length``.
* ``engine``: ``fast_inference=True``; the adapter handed over as tensors (``load_adapter``), then one
  ``generate`` of the batch with ``min_tokens`` = ``max_tokens`` = ``--length``.
* ``engine-vllm-lora-ops``: the same with vLLM's own PyTorch LoRA ops (slimrl's single-adapter path off), to show
  what :mod:`slimrl.generation.cpu_lora` is worth.

Each engine mode generates twice and reports the second (the first includes the engine's start); the adapter has
random ``lora_B`` so the LoRA path is really exercised. Prints tokens/s and ratios to ``hf``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from grpo_step import RESULT_TAG, run_worker  # same directory: one worker in its own process


def worker(mode: str, generations: int, length: int) -> dict:
    import torch

    from slimrl import FastLanguageModel

    engine_mode = mode.startswith("engine")
    model, tok = FastLanguageModel.from_pretrained(
        "SmolLM2-135M-Instruct", max_seq_length=2048, dtype=torch.float32, fast_inference=engine_mode, max_lora_rank=16
    )
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=16)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    chat = [{"role": "user", "content": "Write a long story about the number five."}]
    prompt = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    prompt = list(prompt)
    result = {"mode": mode, "prompt_tokens": len(prompt)}
    if engine_mode:
        from vllm import SamplingParams

        engine = model.vllm_engine
        engine.max_num_seqs = generations
        if mode == "engine-vllm-lora-ops":
            from slimrl.generation import cpu_lora

            engine.start(model)
            cpu_lora.uninstall()
        params = SamplingParams(max_tokens=length, min_tokens=length, temperature=1.0, logprobs=0)
        times = []
        for _ in range(2):
            engine.load_adapter(model)
            t0 = time.perf_counter()
            out = engine.generate_ids([prompt] * generations, params)
            times.append(time.perf_counter() - t0)
            engine.standby()
        tokens = sum(len(o.outputs[0].token_ids) for o in out)
        result.update(seconds=times[-1], tokens=tokens, sync_s=engine.timings["last_sync_s"])
    else:
        FastLanguageModel.for_inference(model)
        ids = torch.tensor([prompt] * generations)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                max_new_tokens=length,
                min_new_tokens=length,
                temperature=1.0,
            )
        result.update(seconds=time.perf_counter() - t0, tokens=int(out[:, len(prompt) :].numel()))
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--modes", default="hf,engine,engine-vllm-lora-ops")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(RESULT_TAG + json.dumps(worker(args.worker, args.generations, args.length)), flush=True)
        return
    results = {}
    for mode in args.modes.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            mode,
            "--generations",
            str(args.generations),
            "--length",
            str(args.length),
        ]
        results[mode] = run_worker(cmd, mode)
    print(f"generation, SmolLM2-135M fp32 + LoRA r=16, {args.generations} x {args.length} tokens")
    print(f"{'mode':22} {'tokens':>7} {'seconds':>8} {'tok/s':>7} {'vs hf':>6}")
    for mode, r in results.items():
        ratio = r["tokens_per_s"] / results["hf"]["tokens_per_s"] if "hf" in results else float("nan")
        print(f"{mode:22} {r['tokens']:7d} {r['seconds']:8.1f} {r['tokens_per_s']:7.1f} {ratio:5.2f}x")
    print(RESULT_TAG + json.dumps(results))


if __name__ == "__main__":
    main()
