"""``slimrl plan``'s predicted peak vs the measured peak, real SmolLM2-135M-Instruct on this CPU.

    python bench/plan_accuracy.py                 # every row below (about 15 min on 2 cores)
    python bench/plan_accuracy.py --rows 0,3      # some rows

Each row is one GRPO step of slimrl (``PatchFastRL`` + ``FastLanguageModel``) run by ``bench/gpu_grpo.py``'s worker in
its own process (peak RSS = that process's ``VmHWM``), completions of exactly the row's length (random tokens, or HF
generate where the row says so), prompt of 32 tokens, TRL's GRPOConfig defaults otherwise (beta 0, dapo). The
prediction is ``slimrl.plan`` with the same settings, computed here before the row runs (no weights loaded).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_grpo import RESULT_TAG, run_worker  # noqa: E402 - the bench directory is not a package

# (rows = generations, completion length, checkpointing, LoRA r, sampling)
ROWS = [
    (4, 128, "slimrl", 16, "generate"),
    (8, 256, "slimrl", 16, "generate"),
    (16, 128, "true", 64, "generate"),
    (8, 512, "slimrl", 16, "random"),
    (8, 512, "false", 16, "random"),
    (8, 512, "selective", 16, "random"),
    (16, 512, "slimrl", 64, "random"),
    (4, 1024, "false", 32, "random"),
    (4, 2048, "slimrl", 8, "random"),
]
PROMPT = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=None, help="comma-separated row numbers (default: all)")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    args = ap.parse_args()
    import warnings

    from slimrl.planning import plan

    picked = [int(i) for i in args.rows.split(",")] if args.rows else range(len(ROWS))
    print(f"{'#':>2} {'rows x len':>11} {'ckpt':>9} {'r':>3} {'sampling':>9} {'predicted':>10} {'measured':>10} "
          f"{'error':>7}", flush=True)
    results = []
    for i in picked:
        rows, length, ckpt, r, sampling = ROWS[i]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            predicted = plan(args.model, per_device_train_batch_size=rows, num_generations=rows,
                             max_prompt_length=PROMPT, max_completion_length=length, lora_r=r,
                             gradient_checkpointing=ckpt, device="cpu", search=False)
        worker_args = SimpleNamespace(shape="tiny", quant="bf16", generations=rows, prompt_length=PROMPT, steps=1,
                                      device="cpu", cache="/tmp/slimrl-gpu-models", cap_gb=None, model=args.model,
                                      lora_r=r, ckpt=ckpt, generate=sampling == "generate")
        measured = run_worker(worker_args, "slimrl", length)
        assert measured["prompt_tokens"] == PROMPT, measured["prompt_tokens"]
        error = predicted.peak_bytes / measured["peak_bytes"] - 1
        row = {"row": i, "rows": rows, "length": length, "ckpt": ckpt, "lora_r": r, "sampling": sampling,
               "predicted_mb": predicted.peak_bytes / 2**20, "measured_mb": measured["peak_bytes"] / 2**20,
               "error": error, "phases_mb": {k: v / 2**20 for k, v in predicted.phases.items()},
               "step_s": measured["step_s"][-1], "predicted_step_s": predicted.step_seconds}
        results.append(row)
        print(f"{i:2} {rows:>4} x {length:<5} {ckpt:>9} {r:>3} {sampling:>9} {row['predicted_mb']:8.0f} MB "
              f"{row['measured_mb']:8.0f} MB {100 * error:+6.1f}%", flush=True)
    print(RESULT_TAG + json.dumps(results))


if __name__ == "__main__":
    main()
