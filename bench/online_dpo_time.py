"""CPU seconds per Online DPO step on the real SmolLM2-135M: TRL alone vs ``PatchFastRL("online_dpo")``, each side in
its own process, the sides alternating (``--repeats`` pairs), the same seed and data.

    python bench/online_dpo_time.py                    # 2 pairs of 3 steps each
    python bench/online_dpo_time.py --steps 4 --repeats 3

LoRA r=16 on every linear layer, 2 prompts per step, 48 new tokens per completion (2 per prompt), a cheap reward
function, fp32 on the CPU. Printed per side: the CPU seconds (user + system, ``time.process_time``) and wall seconds
of each step, first step apart (it pays one-off costs), and the ratio of the sums.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

TAG = "ONLINE_DPO_TIMES "


def worker(side: str, steps: int) -> None:
    import warnings

    warnings.simplefilter("ignore")
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch

    torch.manual_seed(0)
    if side == "slimrl":
        from slimrl import PatchFastRL

        PatchFastRL("online_dpo")
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    from slimrl.models.loader import materialize_gguf, smollm2_gguf_path

    path = str(materialize_gguf(smollm2_gguf_path()))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {a} + {a}?"}]} for a in range(64)])
    times: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            self.start = (time.process_time(), time.perf_counter())

        def on_step_end(self, *args, **kwargs):
            times.append((time.process_time() - self.start[0], time.perf_counter() - self.start[1]))

    args = OnlineDPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=2,
        max_new_tokens=48,
        max_steps=steps,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        seed=3,
    )
    trainer = OnlineDPOTrainer(
        model=model,
        args=args,
        train_dataset=data,
        processing_class=tok,
        reward_funcs=[lambda completions, **k: [float(len(str(c)) % 7) for c in completions]],
        peft_config=LoraConfig(r=16, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
        callbacks=[Clock()],
    )
    trainer.train()
    print(TAG + json.dumps(times), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--worker", choices=("trl", "slimrl"))
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.steps)
        return
    runs: dict[str, list[list[tuple[float, float]]]] = {"trl": [], "slimrl": []}
    for _ in range(a.repeats):
        for side in ("trl", "slimrl"):
            out = subprocess.run(
                [sys.executable, __file__, "--worker", side, "--steps", str(a.steps)],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            runs[side].append(json.loads(next(x for x in out.splitlines() if x.startswith(TAG))[len(TAG) :]))
    total = {side: sum(c for run in r for c, _ in run) for side, r in runs.items()}
    for side, r in runs.items():
        first = [round(run[0][0], 1) for run in r]
        later = [round(c, 1) for run in r for c, _ in run[1:]]
        print(f"{side:<7} first step CPU s {first}  later steps CPU s {later}  total {total[side]:.1f}")
    print(f"slimrl / TRL alone, CPU seconds over every step: {total['slimrl'] / total['trl']:.3f}")


if __name__ == "__main__":
    main()
