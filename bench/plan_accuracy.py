"""``slimrl plan``'s predicted peak vs the measured peak, real SmolLM2-135M-Instruct on this CPU.

    python bench/plan_accuracy.py                 # every row below (about 15 min on 2 cores)
    python bench/plan_accuracy.py --rows 0,3      # some rows
    python bench/plan_accuracy.py --rows none --engine .venv-vllm/bin/python   # the engine rows only

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

# (rows = generations, completion length, checkpointing, LoRA r, sampling[, prompt tokens, side]); the default
# prompt is PROMPT tokens and the side slimrl (shared-prefix layout on: one prompt per step); "slimrl/noshared" keeps
# TRL's row layout in the log-prob passes
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
    (8, 256, "slimrl", 16, "random", 1024, "slimrl"),
    (8, 256, "slimrl", 16, "random", 1024, "slimrl/noshared"),
]
PROMPT = 32
# Engine rows (rows = generations, completion length): bench/grpo_step.py's `engine` worker (slimrl's colocated vLLM
# engine, LoRA r=16 on every projection, beta 0.04, its chat prompt, 2 steps), run by the vLLM environment's Python.
ENGINE_ROWS = [(8, 256), (4, 512)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=None, help="comma-separated row numbers (default: all)")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct")
    ap.add_argument(
        "--engine",
        metavar="PYTHON",
        default=None,
        help="also the engine rows, run by this Python (with vLLM), e.g. .venv-vllm/bin/python",
    )
    args = ap.parse_args()
    import warnings

    from slimrl.planning import Settings, plan

    picked = [] if args.rows == "none" else [int(i) for i in args.rows.split(",")] if args.rows else range(len(ROWS))
    print(
        f"{'#':>2} {'rows x len':>11} {'ckpt':>9} {'r':>3} {'sampling':>9} {'predicted':>10} {'measured':>10} "
        f"{'error':>7}",
        flush=True,
    )
    results = []
    for i in picked:
        rows, length, ckpt, r, sampling, *more = ROWS[i]
        prompt, side = more or (PROMPT, "slimrl")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            predicted = plan(
                args.model,
                Settings(
                    per_device_train_batch_size=rows,
                    num_generations=rows,
                    max_prompt_length=prompt,
                    max_completion_length=length,
                    lora_r=r,
                    gradient_checkpointing=ckpt,
                    device="cpu",
                    shared_prefix=side != "slimrl/noshared",
                ),
                search=False,
            )
        worker_args = SimpleNamespace(
            shape="tiny",
            quant="bf16",
            generations=rows,
            prompt_length=prompt,
            steps=1,
            device="cpu",
            cache="/tmp/slimrl-gpu-models",
            cap_gb=None,
            model=args.model,
            lora_r=r,
            ckpt=ckpt,
            generate=sampling == "generate",
        )
        measured = run_worker(worker_args, side, length)
        assert measured["prompt_tokens"] == prompt, measured["prompt_tokens"]
        error = predicted.peak_bytes / measured["peak_bytes"] - 1
        row = {
            "row": i,
            "rows": rows,
            "length": length,
            "ckpt": ckpt,
            "lora_r": r,
            "sampling": sampling,
            "prompt": prompt,
            "shared_prefix": predicted.settings["shared_prefix"],
            "predicted_mb": predicted.peak_bytes / 2**20,
            "measured_mb": measured["peak_bytes"] / 2**20,
            "error": error,
            "phases_mb": {k: v / 2**20 for k, v in predicted.phases.items()},
            "step_s": measured["step_s"][-1],
            "predicted_step_s": predicted.step_seconds,
        }
        results.append(row)
        print(
            f"{i:2} {rows:>4} x {length:<5} {ckpt:>9} {r:>3} {sampling:>9} {row['predicted_mb']:8.0f} MB "
            f"{row['measured_mb']:8.0f} MB {100 * error:+6.1f}%  prompt {prompt}"
            f"{' shared prefix' if row['shared_prefix'] else ''}  {row['predicted_step_s']:.0f} s predicted, "
            f"{row['step_s']:.0f} s measured",
            flush=True,
        )
    if args.engine:
        results += engine_rows(args.engine, args.model)
    print(RESULT_TAG + json.dumps(results))


def engine_rows(python: str, model: str) -> list[dict]:
    """Predicted vs measured peak of ``grpo_step.py``'s engine worker (its settings: LoRA r=16, beta 0.04, the chat
    prompt of its dataset, fast_inference=True)."""
    import subprocess

    from transformers import AutoTokenizer

    from slimrl.models.loader import resolve_model_path

    tok = AutoTokenizer.from_pretrained(str(resolve_model_path(model)))
    prompt = len(
        tok.apply_chat_template(
            [{"role": "user", "content": "Write a long story about the number five."}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
    )
    out = []
    for rows, length in ENGINE_ROWS:
        # predicted in the engine's Python: the engine's runtime is measured (once) where vLLM runs
        settings = dict(
            per_device_train_batch_size=rows,
            num_generations=rows,
            max_prompt_length=prompt,
            max_completion_length=length,
            lora_r=16,
            beta=0.04,
            fast_inference=True,
            device="cpu",
        )
        code = (
            f"import json; from slimrl.planning import Settings, plan; "
            f"p = plan({model!r}, Settings(**{settings!r}), search=False); "
            f"print({RESULT_TAG!r} + json.dumps(p.to_json()))"
        )
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"plan in the engine's Python failed: {proc.stderr[-3000:]}")
        predicted = json.loads(lines[-1][len(RESULT_TAG) :])
        if predicted["notes"]:
            print("   plan notes:", predicted["notes"], flush=True)
        script = str(Path(__file__).resolve().parent / "grpo_step.py")
        proc = subprocess.run(
            [python, script, "--worker", "engine", "--generations", str(rows), "--length", str(length), "--steps", "2"],
            capture_output=True,
            text=True,
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_TAG)]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"engine worker failed: {proc.stderr[-3000:]}")
        measured = json.loads(lines[-1][len(RESULT_TAG) :])
        error = predicted["peak_bytes"] / 2**20 / measured["peak_rss_mb"] - 1
        row = {
            "rows": rows,
            "length": length,
            "ckpt": "slimrl",
            "lora_r": 16,
            "sampling": "engine",
            "prompt": prompt,
            "predicted_mb": predicted["peak_bytes"] / 2**20,
            "measured_mb": measured["peak_rss_mb"],
            "error": error,
            "phases_mb": {k: v / 2**20 for k, v in predicted["phases"].items()},
            "step_s": measured["step_s"][-1],
            "predicted_step_s": predicted["step_seconds"],
        }
        out.append(row)
        print(
            f"E  {rows:>4} x {length:<5} {'slimrl':>9} {16:>3} {'engine':>9} {row['predicted_mb']:8.0f} MB "
            f"{row['measured_mb']:8.0f} MB {100 * error:+6.1f}%",
            flush=True,
        )
    return out


if __name__ == "__main__":
    main()
