"""The end of every Unsloth RL notebook, on the real SmolLM2-135M-Instruct on a CPU: train a few GRPO steps, save
the LoRA, try it with ``fast_generate(..., lora_request=model.load_lora(...))``, then write the merged 16-bit model
and a q4_k_m GGUF for llama.cpp / Ollama.

    python examples/train_then_export.py --out exported [--steps 2]

The GGUF step needs llama.cpp's converter and quantizer (``pip install 'slimrl[gguf]'``; ``make test`` builds
them into ``.venv-gguf``). Prints what it wrote, with sizes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from slimrl import FastLanguageModel, PatchFastRL, vLLMSamplingParams

PatchFastRL("grpo", FastLanguageModel)

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from slimrl.data import correctness_reward, format_reward, make_arithmetic_dataset  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="directory for the adapter, the merged model and the GGUF")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    out = Path(args.out)

    model, tokenizer = FastLanguageModel.from_pretrained(
        "SmolLM2-135M-Instruct", max_seq_length=256, load_in_4bit=False, max_lora_rank=8
    )
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, random_state=3407)
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[correctness_reward, format_reward],
        train_dataset=make_arithmetic_dataset(32),
        args=GRPOConfig(
            output_dir=str(out / "run"),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=16,
            max_steps=args.steps,
            learning_rate=5e-5,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
        ),
    )
    trainer.train()

    # the notebook's last cells
    model.save_lora(str(out / "grpo_saved_lora"))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 30?"}], tokenize=False, add_generation_prompt=True
    )
    sampling = vLLMSamplingParams(temperature=0.8, top_p=0.95, max_tokens=24)
    reply = (
        model.fast_generate(text, sampling_params=sampling, lora_request=model.load_lora(str(out / "grpo_saved_lora")))[
            0
        ]
        .outputs[0]
        .text
    )
    print("with the trained adapter:", repr(reply))
    model.save_pretrained_merged(str(out / "model"), tokenizer, save_method="merged_16bit")
    model.save_pretrained_gguf(str(out / "gguf"), tokenizer, quantization_method="q4_k_m")
    for path in sorted(p for p in out.rglob("*") if p.is_file() and "run" not in p.parts):
        print(f"{path.relative_to(out)}  {path.stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
