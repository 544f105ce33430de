"""How far slimrl's fast_inference engine (vLLM) is from the model being trained, per setting: the k3 KL per token
(``sampling/kl_k3/mean``), the share of sequences TRL's default correction masks (``sequence_mask``, cap 3), the
mean raw importance ratio, with and without ``slimrl_truncated_sampling_fix``.

One process per (dtype, LoRA rank) — the engine lives with the model — running GRPO on SmolLM2-135M-Instruct's
arithmetic task (8 rows = 2 prompts x 4 generations, 32 completion tokens, lr 5e-4, beta 0) for ``--steps`` steps per
setting from the same adapter; the figures are means over the steps after the first (the adapter has moved).

    .venv-vllm/bin/python bench/mismatch.py               # every row (about 14 minutes on the 2-core CPU)
    .venv-vllm/bin/python bench/mismatch.py --dtype float32 --rank 16 --steps 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

SETTINGS = [(1.0, False), (0.8, False), (0.8, True)]  # (top_p, slimrl_truncated_sampling_fix)
KEYS = {
    "kl": "sampling/kl_k3/mean",
    "masked": "sampling/is_masked_share/sequence",
    "raw": "sampling/raw_importance_sampling_ratio/mean",
    "trl_ratio": "sampling/importance_sampling_ratio/mean",
}


def one(dtype: str, rank: int, steps: int) -> list[dict]:
    """Every setting of :data:`SETTINGS` with one model and engine of ``dtype`` and a LoRA of ``rank``."""
    import torch

    from slimrl import FastLanguageModel, PatchFastRL
    from slimrl.data import correctness_reward, format_reward, make_arithmetic_dataset

    PatchFastRL("grpo", FastLanguageModel)
    from trl import GRPOConfig, GRPOTrainer

    model, tok = FastLanguageModel.from_pretrained(
        "SmolLM2-135M-Instruct",
        max_seq_length=256,
        dtype=getattr(torch, dtype),
        fast_inference=True,
        max_lora_rank=rank,
        gpu_memory_utilization="auto",
    )
    model = FastLanguageModel.get_peft_model(model, r=rank, lora_alpha=rank, use_gradient_checkpointing=False)
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    out = []
    for top_p, fix in SETTINGS:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in start:
                    p.copy_(start[n])
        cfg = GRPOConfig(
            output_dir=tempfile.mkdtemp(),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=32,
            max_steps=steps,
            learning_rate=5e-4,
            beta=0.0,
            temperature=1.0,
            top_p=top_p,
            seed=3407,
            report_to="none",
            use_cpu=True,
            bf16=dtype == "bfloat16",
            save_strategy="no",
            logging_steps=1,
            slimrl_truncated_sampling_fix=fix,
            slimrl_health=False,
        )
        trainer = GRPOTrainer(
            model=model,
            args=cfg,
            train_dataset=make_arithmetic_dataset(64),
            processing_class=tok,
            reward_funcs=[correctness_reward, format_reward],
        )
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h][1:]
        row = {"dtype": dtype, "rank": rank, "top_p": top_p, "fix": fix, "steps": len(logs)}
        row.update({k: sum(h[key] for h in logs) / len(logs) for k, key in KEYS.items()})
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", choices=["float32", "bfloat16"])
    ap.add_argument("--rank", type=int)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    if args.dtype and args.rank:
        one(args.dtype, args.rank, args.steps)
        return
    rows = []
    for dtype in ("float32", "bfloat16"):
        for rank in (16, 64):
            done = subprocess.run(
                [sys.executable, __file__, "--dtype", dtype, "--rank", str(rank), "--steps", str(args.steps)],
                capture_output=True,
                text=True,
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith('{"dtype"')]
            if done.returncode or not lines:
                print(f"{dtype} r={rank}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
            rows += [json.loads(line) for line in lines]
    print(
        "| engine + trainer dtype | LoRA r | top_p | slimrl_truncated_sampling_fix | KL k3 per token | "
        "sequences masked | mean raw ratio | TRL's mean ratio (after masking) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['dtype']} | {r['rank']} | {r['top_p']} | {'on' if r['fix'] else 'off'} | {r['kl']:.2e} | "
            f"{r['masked']:.0%} | {r['raw']:.4f} | {r['trl_ratio']:.4f} |"
        )


if __name__ == "__main__":
    main()
