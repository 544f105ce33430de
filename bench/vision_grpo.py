"""GRPO on images: TRL alone vs slimrl, each side in its own process (its own peak RSS), one run.

    python bench/vision_grpo.py                       # Qwen2.5-VL-3B's widths, 2 text + 2 vision layers
    python bench/vision_grpo.py --shape tiny --length 16  # the plumbing in seconds

The model is a Qwen2.5-VL of realistic width but few layers, random weights (nothing downloaded; built by
:mod:`slimrl.verify.tiny_vision` and saved once under ``/tmp/slimrl-vision-bench``): the ``3b`` shape has
Qwen2.5-VL-3B's text width (2048, MLP 11008, 16 heads / 2 KV heads, vocabulary 151936, tied head) and vision
width (1280, MLP 3420, 16 heads), with ``--text-layers`` / ``--vision-layers`` layers. Each prompt holds one image
of ``--image`` pixels square (448: 1024 patch rows, 256 image tokens after the 2x2 merge) and a question;
``--generations`` completions of exactly ``--length`` tokens (``min_new_tokens``), beta = 0.04 (a reference pass),
LoRA r=16 on the language model's projections (both sides the same regex), fp32 on the CPU.

* ``trl``: the model from ``AutoModelForImageTextToText``, the adapter through ``GRPOTrainer(peft_config=...)``,
  GRPOConfig's defaults (gradient checkpointing on). The processor is loaded with slimrl's loader only because
  transformers cannot build a Qwen-VL processor without torchvision (it does not touch training).
* ``slimrl``: ``PatchFastRL("grpo")``, ``FastVisionModel.from_pretrained`` / ``get_peft_model`` with the same LoRA.

Printed: peak RSS and step time per side, the ratio, and with ``--profile`` the peak and seconds per phase
(generation, no-grad log-probs, policy forward, backward): the vision tower and the image tokens run the same
code on both sides, so where slimrl cannot help shows as equal phases.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step import RESULT_TAG, PhaseProfiler, _hwm_mb, profile_phases, run_worker  # noqa: E402  (bench/ is not a package)

SHAPES = {
    "3b": dict(
        text_width=dict(hidden_size=2048, intermediate_size=11008, num_attention_heads=16, num_key_value_heads=2),
        vision_width=dict(hidden_size=1280, intermediate_size=3420, num_attention_heads=16),
        vocab_size=151936,
    ),
    "tiny": dict(text_width=None, vision_width=None, vocab_size=None),
}
LORA_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def model_dir(args: argparse.Namespace) -> Path:
    """The random model of the asked shape, saved once (the same weights for every side)."""
    path = Path("/tmp/slimrl-vision-bench") / f"{args.shape}-t{args.text_layers}-v{args.vision_layers}-{args.image}"
    if not (path / "config.json").is_file():
        from slimrl.verify.tiny_vision import build

        shape = SHAPES[args.shape]
        text = {**(shape["text_width"] or {}), "num_hidden_layers": args.text_layers}
        tv = build(
            "qwen2.5-vl",
            seed=0,
            image_size=args.image,
            vocab_size=shape["vocab_size"],
            text_width=text,
            vision_width=shape["vision_width"],
            vision_layers=args.vision_layers,
        )
        tv.model.save_pretrained(path)
        tv.processor.save_pretrained(path)
    return path


def _reward(completions, **kwargs):
    return [float(len(c[0]["content"]) % 7) for c in completions]


def worker(args: argparse.Namespace) -> dict:
    import torch

    torch.manual_seed(0)
    prof = PhaseProfiler()
    prof.start()
    from datasets import Dataset

    from slimrl.verify.tiny_vision import images

    path = str(model_dir(args))
    lora = dict(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=LORA_TARGETS)
    if args.worker == "slimrl":
        from slimrl import FastVisionModel, PatchFastRL

        PatchFastRL("grpo", FastVisionModel)
        model, processor = FastVisionModel.from_pretrained(path, max_seq_length=4096)
        model = FastVisionModel.get_peft_model(model, **lora)
        trainer_kwargs = {}
    else:
        from peft import LoraConfig
        from transformers import AutoModelForImageTextToText

        from slimrl.models.vision import load_processor

        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
        processor = load_processor(path)
        trainer_kwargs = {"peft_config": LoraConfig(task_type="CAUSAL_LM", **lora)}
    from trl import GRPOConfig, GRPOTrainer

    rows = [
        {
            "prompt": [{"role": "user", "content": "How many dots are in the picture? Answer with a number."}],
            "image": im,
        }
        for im in images(16, args.image, seed=3)
    ]
    cfg = GRPOConfig(
        output_dir="/tmp/slimrl-bench",
        per_device_train_batch_size=args.generations,
        num_generations=args.generations,
        beta=0.04,
        max_completion_length=args.length,
        generation_kwargs={"min_new_tokens": args.length},
        max_steps=args.steps,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        bf16=False,
        use_cpu=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        args=cfg,
        reward_funcs=[_reward],
        train_dataset=Dataset.from_list(rows),
        processing_class=processor,
        **trainer_kwargs,
    )
    step_times = profile_phases(prof, trainer)
    with prof.phase("other (train loop, optimizer)"):
        trainer.train()
    prof.stop()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    from slimrl.patching.routes import served

    return {
        "mode": args.worker,
        "peak_rss_mb": _hwm_mb(),
        "step_s": step_times,
        "phase_peak_rss_mb": prof.peaks,
        "phase_s": prof.seconds,
        "loss": logs[-1]["loss"] if logs else None,
        "completion_len": logs[-1].get("completions/mean_length") if logs else None,
        "slimrl_calls": served(trainer) if args.worker == "slimrl" else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="3b")
    ap.add_argument("--text-layers", type=int, default=2)
    ap.add_argument("--vision-layers", type=int, default=2)
    ap.add_argument("--image", type=int, default=448, help="image side in pixels (a multiple of 28)")
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--modes", default="trl,slimrl")
    ap.add_argument("--profile", action="store_true", help="print peak RSS and seconds per phase")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(RESULT_TAG + json.dumps(worker(args)), flush=True)
        return
    model_dir(args)  # built once, before either side is timed
    forwarded = [a for a in sys.argv[1:] if not a.startswith("--modes")]
    if "--modes" in sys.argv:
        i = sys.argv.index("--modes")
        forwarded = [a for j, a in enumerate(sys.argv[1:], 1) if j not in (i, i + 1)]
    results = {
        mode: run_worker([sys.executable, __file__, "--worker", mode] + forwarded, mode)
        for mode in args.modes.split(",")
    }
    print(
        f"GRPO step with images: Qwen2.5-VL shape {args.shape}, {args.text_layers} text + {args.vision_layers} "
        f"vision layers, {args.image}px images, {args.generations} x {args.length} tokens, LoRA r=16, beta=0.04"
    )
    print(f"{'mode':8} {'peak RSS MB':>12} {'s/step':>8} {'loss':>10} {'mean len':>9}")
    for mode, r in results.items():
        print(
            f"{mode:8} {r['peak_rss_mb']:12.0f} {r['step_s'][-1]:8.1f} {r['loss']!s:>10} {r['completion_len']!s:>9}"
            + (f"  slimrl log-prob calls {r['slimrl_calls']}" if r.get("slimrl_calls") else "")
        )
        if args.profile:
            for phase, mb in sorted(r["phase_peak_rss_mb"].items(), key=lambda kv: -kv[1]):
                print(f"    {phase:34} {mb:8.0f} MB {r['phase_s'].get(phase, 0.0):8.1f} s")
    if {"trl", "slimrl"} <= results.keys():
        s, t = results["slimrl"], results["trl"]
        print(
            f"ratio slimrl/trl: peak RSS {s['peak_rss_mb'] / t['peak_rss_mb']:.2f}x, "
            f"time {s['step_s'][-1] / t['step_s'][-1]:.2f}x"
        )
    print(RESULT_TAG + json.dumps(results))


if __name__ == "__main__":
    main()
