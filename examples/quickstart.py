"""README quick start: a few GRPO steps on the real SmolLM2-135M-Instruct, on CPU, through slimrl.

    python examples/quickstart.py [--steps 6]

The task: small additions ("What is 17 + 25?"), rewarded for the right number and for a short answer.
"""

from __future__ import annotations

import argparse
import random
import re

from slimrl import FastLanguageModel, PatchFastRL

PatchFastRL("grpo", FastLanguageModel)

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


def make_dataset(n: int, seed: int = 3407) -> Dataset:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}],
                "answer": str(a + b),
            }
        )
    return Dataset.from_list(rows)


def correct_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the last number in the completion equals the answer."""
    out = []
    for completion, ans in zip(completions, answer):
        numbers = re.findall(r"-?\d+", completion[0]["content"])
        out.append(1.0 if numbers and numbers[-1] == ans else 0.0)
    return out


def short_reward(completions, **kwargs) -> list[float]:
    """Up to 0.5 for answers of at most 12 characters (the number only)."""
    return [0.5 if len(c[0]["content"].strip()) <= 12 else 0.0 for c in completions]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()

    model, tokenizer = FastLanguageModel.from_pretrained(
        "SmolLM2-135M-Instruct", max_seq_length=512, load_in_4bit=False, fast_inference=False
    )
    model = FastLanguageModel.get_peft_model(model, r=16, lora_alpha=32)
    config = GRPOConfig(
        output_dir="outputs/quickstart",
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=24,
        learning_rate=5e-5,
        max_steps=args.steps,
        logging_steps=1,
        beta=0.04,
        temperature=1.0,
        report_to="none",
        save_strategy="no",
        bf16=False,
        use_cpu=True,
        seed=3407,
        unsloth_num_chunks=-1,
    )
    trainer = GRPOTrainer(
        model=model,
        args=config,
        reward_funcs=[correct_reward, short_reward],
        train_dataset=make_dataset(64),
        processing_class=tokenizer,
    )
    trainer.train()
    print("\nstep  reward  correct  peak_MB  tokens/s")
    for row in trainer.state.log_history:
        if "reward" in row:
            print(
                f"{row['step']:4d}  {row['reward']:6.3f}  {row['rewards/correct_reward/mean']:7.3f}  "
                f"{row['memory/peak_mb']:7.0f}  {row['tokens_per_s']:8.1f}"
            )


if __name__ == "__main__":
    main()
