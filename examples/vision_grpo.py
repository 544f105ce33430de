"""Vision GRPO as an Unsloth vision notebook writes it (``FastVisionModel``, image prompts, GRPO), runnable on a CPU
with nothing downloaded: "how many dots are in the picture?" on images drawn here.

    python examples/vision_grpo.py [--steps 40] [--model DIR]

Without ``--model`` the model is a tiny *randomly initialised* Qwen2.5-VL (2 text layers of width 32, a 1-layer
vision tower, character-level tokenizer; :mod:`slimrl.verify.tiny_vision`) saved to a temporary directory. It shows
the plumbing — loading with its processor, LoRA on both towers, images through the patched trainer — and the reward
rising, but what it learns is the answer's *form* (a digit first) and a guess; it does not learn to count dots in a
few minutes from random weights. With a real model (a local directory or hub id) the same script trains it, e.g.
``--model unsloth/Qwen2.5-VL-3B-Instruct`` on a GPU.

Prints the mean reward of the first and last five steps.
"""

from __future__ import annotations

import argparse
import re
import tempfile

from slimrl import FastVisionModel, PatchFastRL

PatchFastRL("grpo", FastVisionModel)

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from slimrl.verify.tiny_vision import build, images  # noqa: E402


def answer_reward(completions, dots, **kwargs) -> list[float]:
    """1 for a completion that starts with the number of dots, 0.5 for one that starts with another digit, else 0."""
    out = []
    for completion, count in zip(completions, dots, strict=True):
        first = re.match(r"\s*(\d)", completion[0]["content"])
        out.append(0.0 if first is None else 1.0 if int(first.group(1)) == count else 0.5)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--model", help="a vision-language model (directory or hub id); default: the tiny random one")
    ap.add_argument("--image", type=int, default=56, help="image side in pixels")
    args = ap.parse_args()

    path = args.model
    if path is None:
        path = tempfile.mkdtemp(prefix="slimrl-tiny-vlm-")
        tiny = build("qwen2.5-vl", seed=0, image_size=args.image)
        tiny.model.save_pretrained(path)
        tiny.processor.save_pretrained(path)
    # The tiny random model trains every weight (LoRA on a width-32 model with near-uniform outputs moves them too
    # little to see in 40 steps); a real model gets LoRA on both towers, as Unsloth's vision notebooks do.
    tiny_run = args.model is None
    model, processor = FastVisionModel.from_pretrained(
        path, max_seq_length=1024, load_in_4bit=not tiny_run, full_finetuning=tiny_run
    )
    model = FastVisionModel.get_peft_model(
        model,
        r=16,
        lora_alpha=16,
        finetune_vision_layers=True,
        finetune_language_layers=True,
        use_gradient_checkpointing=False,
    )
    pics = images(64, args.image, seed=0)
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": "How many dots? Answer with a digit."}],
                "image": im,
                "dots": im.info["dots"],
            }
            for im in pics
        ]
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=processor,
        reward_funcs=[answer_reward],
        train_dataset=dataset,
        args=GRPOConfig(
            output_dir=tempfile.mkdtemp(prefix="slimrl-vision-run-"),
            per_device_train_batch_size=8,
            num_generations=8,
            max_completion_length=4,
            max_steps=args.steps,
            learning_rate=1e-2 if tiny_run else 5e-5,
            temperature=1.0,
            beta=0.0,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            seed=0,
        ),
    )
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    first, last = rewards[:5], rewards[-5:]
    print(
        f"mean reward, first 5 steps {sum(first) / len(first):.3f} -> last 5 steps {sum(last) / len(last):.3f} "
        f"({len(rewards)} steps)"
    )


if __name__ == "__main__":
    main()
