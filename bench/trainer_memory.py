"""One training step of an offline trainer on the real SmolLM2-135M: TRL alone vs slimrl, one process each.

    python bench/trainer_memory.py --trainers dpo,kto,sft,orpo,cpo --length 1024
    python bench/trainer_memory.py --trainers orpo --length 256 --modes slimrl     # one side only

Every example is ``--length`` tokens (a ``--prompt-length``-token prompt plus the completion, cut to exactly that
many tokens), ``8 x length`` tokens per step: 4 pairs (8 sequences) for the paired trainers DPO, ORPO, CPO,
8 examples for KTO (plus its 8 mismatched KL sequences), BCO (trl 1.12.0) and SFT. LoRA r=16 on every projection, fp32,
gradient checkpointing on for both sides (so the ratio is the log-prob path's, not checkpointing's).

* ``trl``: the trainer as TRL ships it, model from ``AutoModelForCausalLM``, adapter through ``peft_config``.
* ``slimrl``: ``PatchFastRL(<trainer>)`` + ``FastLanguageModel.from_pretrained`` / ``get_peft_model`` (same LoRA).

Each side runs in a fresh subprocess so its peak RSS (``VmHWM``) is its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from grpo_step import RESULT_TAG, _hwm_mb, run_worker  # same directory: peak RSS (VmHWM), one worker process

PAIRED = {"dpo", "orpo", "cpo"}
LORA = dict(
    r=16,
    lora_alpha=16,
    lora_dropout=0.0,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)
WORDS = (
    "the cat sat on a mat while seven birds sang about numbers rivers and old stone bridges near the sea "
    "every morning people walked slowly to work thinking of bread coffee music and the long summer"
).split()


def _text(tok, n_tokens: int, seed: int) -> str:
    """A text of exactly ``n_tokens`` tokens (plain words, cut at the token level)."""
    import random

    rng = random.Random(seed)
    words = " ".join(rng.choice(WORDS) for _ in range(n_tokens * 2))
    ids = tok(words, add_special_tokens=False)["input_ids"][:n_tokens]
    return tok.decode(ids)


def _dataset(name: str, tok, length: int, prompt_len: int, n: int):
    from datasets import Dataset

    comp = length - prompt_len
    rows = []
    for i in range(n):
        prompt, good, bad = _text(tok, prompt_len, i), _text(tok, comp, 100 + i), _text(tok, comp, 200 + i)
        if name in PAIRED:
            rows.append({"prompt": prompt, "chosen": good, "rejected": bad})
        elif name in ("kto", "bco"):
            rows.append({"prompt": prompt, "completion": good if i % 2 else bad, "label": bool(i % 2)})
        else:  # sft
            rows.append({"prompt": prompt, "completion": good})
    return Dataset.from_list(rows)


def _classes(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "dpo":
            from trl import DPOConfig, DPOTrainer

            return DPOTrainer, DPOConfig
        if name == "kto":
            from trl import KTOConfig, KTOTrainer

            return KTOTrainer, KTOConfig
        if name == "sft":
            from trl import SFTConfig, SFTTrainer

            return SFTTrainer, SFTConfig
        if name == "orpo":
            from trl.experimental.orpo import ORPOConfig, ORPOTrainer

            return ORPOTrainer, ORPOConfig
        if name == "cpo":
            from trl.experimental.cpo import CPOConfig, CPOTrainer

            return CPOTrainer, CPOConfig
        if name == "bco":  # TRL <= 1.12.0
            from trl.experimental.bco import BCOConfig, BCOTrainer

            return BCOTrainer, BCOConfig
    raise SystemExit(f"unknown trainer {name!r}")


def worker(args: argparse.Namespace) -> dict:
    import torch

    torch.manual_seed(0)
    from slimrl.models.loader import resolve_model_path

    name = args.trainer
    path = str(resolve_model_path("SmolLM2-135M-Instruct"))
    if args.worker == "slimrl":
        from slimrl import FastLanguageModel, PatchFastRL

        PatchFastRL(name, FastLanguageModel)
        model, tok = FastLanguageModel.from_pretrained(path, max_seq_length=max(2048, args.length))
        model = FastLanguageModel.get_peft_model(model, **LORA)
        trainer_kwargs = {}
    else:
        from peft import LoraConfig
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(path)
        trainer_kwargs = {"peft_config": LoraConfig(task_type="CAUSAL_LM", **LORA)}
    trainer_cls, config_cls = _classes(name)
    n = 4 if name in PAIRED else 8
    ds = _dataset(name, tok, args.length, args.prompt_length, n)
    fields = config_cls.__dataclass_fields__
    cfg = dict(
        output_dir="/tmp/slimrl-bench-" + name,
        per_device_train_batch_size=n,
        max_steps=1,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        bf16=False,
        use_cpu=True,
        seed=0,
        gradient_checkpointing=True,
        learning_rate=1e-5,
        max_length=args.length,
    )
    if "max_prompt_length" in fields:
        cfg["max_prompt_length"] = args.prompt_length
    if "max_completion_length" in fields and name != "sft":
        cfg["max_completion_length"] = args.length - args.prompt_length
    if name == "sft":
        cfg["loss_type"] = "nll"  # TRL's default on 1.16; the fused head path
    trainer = trainer_cls(model=model, args=config_cls(**cfg), train_dataset=ds, processing_class=tok, **trainer_kwargs)
    t0 = time.perf_counter()
    trainer.train()
    dt = time.perf_counter() - t0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return {
        "mode": args.worker,
        "trainer": name,
        "peak_rss_mb": _hwm_mb(),
        "train_s": dt,
        "loss": logs[-1]["loss"] if logs else None,
        "threads": torch.get_num_threads(),
    }


def run_side(mode: str, trainer: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        mode,
        "--trainer",
        trainer,
        "--length",
        str(args.length),
        "--prompt-length",
        str(args.prompt_length),
    ]
    return run_worker(cmd, f"{trainer}/{mode}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainers", default="dpo,kto,sft,orpo,cpo")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--modes", default="trl,slimrl")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--trainer", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(RESULT_TAG + json.dumps(worker(args)), flush=True)
        return
    from importlib.metadata import version

    print(
        f"one training step, SmolLM2-135M fp32, LoRA r=16, 8 x {args.length} tokens, grad-ckpt on, trl {version('trl')}"
    )
    print(
        f"{'trainer':8} {'TRL MB':>8} {'slimrl MB':>10} {'ratio':>6} {'TRL s':>7} {'slimrl s':>9} {'ratio':>6} "
        f"{'TRL loss':>10} {'slimrl loss':>12}"
    )
    results = {}
    for trainer in args.trainers.split(","):
        res = {mode: run_side(mode, trainer, args) for mode in args.modes.split(",")}
        results[trainer] = res
        t, s = res.get("trl"), res.get("slimrl")
        cells = [
            f"{trainer:8}",
            f"{t['peak_rss_mb']:8.0f}" if t else f"{'-':>8}",
            f"{s['peak_rss_mb']:10.0f}" if s else f"{'-':>10}",
        ]
        cells.append(f"{s['peak_rss_mb'] / t['peak_rss_mb']:5.2f}x" if t and s else f"{'-':>6}")
        cells += [f"{t['train_s']:7.1f}" if t else f"{'-':>7}", f"{s['train_s']:9.1f}" if s else f"{'-':>9}"]
        cells.append(f"{s['train_s'] / t['train_s']:5.2f}x" if t and s else f"{'-':>6}")
        cells += [f"{t['loss']!s:>10}" if t else f"{'-':>10}", f"{s['loss']!s:>12}" if s else f"{'-':>12}"]
        print(" ".join(cells), flush=True)
    print(RESULT_TAG + json.dumps(results))


if __name__ == "__main__":
    main()
