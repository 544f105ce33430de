"""``slimrl train``: TRL's trainers through slimrl, with an embedded default that learns on a CPU.

``--algorithm`` picks the trainer: ``grpo`` (default) and ``rloo`` learn online from rewards; ``dpo``, ``orpo``,
``cpo`` from preference pairs, ``kto`` from unpaired good/bad examples, ``sft`` from demonstrations. Every field
of that trainer's config (``GRPOConfig``, ``DPOConfig``, ...) is a flag and a YAML key (TRL's own ``TrlParser``),
and so are slimrl's options (:class:`TrainArguments`). With no arguments: SmolLM2-135M-Instruct + LoRA on seeded
arithmetic word problems (rewards for the right number and for the ``<answer>`` tag; for the offline algorithms,
the right answer vs a near miss), greedy eval on a held-out split before and after.

Order of work: parse -> validate everything that needs no model (one clear line on error, exit 2) -> load the
model -> eval -> train (checkpoints every ``save_steps``; ``--resume`` continues) -> eval -> save adapter,
tokenizer, metrics, plot -> summary table.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from slimrl.cli.args import ALGORITHMS, ONLINE, TrainArguments, UsageError, parse
from slimrl.cli.data import load_dataset_arg, load_rewards
from slimrl.cli.evaluate import greedy_eval

__all__ = ["main", "parse", "run", "UsageError", "TrainArguments", "ALGORITHMS"]


# ---------------------------------------------------------------- validation before the model loads


def memory_fraction(value: str) -> float | str:
    """``--gpu_memory_utilization``: 'auto' or a float in (0, 1)."""
    if value == "auto":
        return value
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction < 1:
        raise UsageError(f"--gpu_memory_utilization {value}: pass a fraction between 0 and 1, or auto")
    return fraction


def validate(targs: TrainArguments, cfg: Any) -> None:
    """What the config's own checks cannot see: slimrl's options against each other and the config."""
    algorithm = targs.algorithm
    if targs.use_gradient_checkpointing.lower() not in ("slimrl", "unsloth", "true", "false"):
        raise UsageError(f"--use_gradient_checkpointing {targs.use_gradient_checkpointing}: use slimrl, true "
                         f"or false")
    if targs.reward and algorithm not in ONLINE:
        raise UsageError(f"--reward: --algorithm {algorithm} learns from its dataset, not from reward functions; "
                         f"drop --reward or use --algorithm {' / '.join(ONLINE)}")
    if algorithm in ONLINE and cfg.max_completion_length >= targs.max_seq_length:
        raise UsageError(f"--max_completion_length {cfg.max_completion_length} leaves no room for the prompt in "
                         f"--max_seq_length {targs.max_seq_length}; lower the first or raise the second")
    max_length = getattr(cfg, "max_length", None)
    if algorithm not in ONLINE and max_length is not None and max_length > targs.max_seq_length:
        raise UsageError(f"--max_length {max_length} is over --max_seq_length {targs.max_seq_length}; lower the "
                         f"first or raise the second")
    memory_fraction(targs.gpu_memory_utilization)


def resolve_resume(targs: TrainArguments, output_dir: str) -> str | None:
    """The checkpoint to resume from: ``latest`` = the newest complete ``checkpoint-N`` in ``output_dir``."""
    if targs.resume is None:
        return None
    if targs.resume != "latest":
        if not Path(targs.resume).is_dir():
            raise UsageError(f"--resume {targs.resume}: no such checkpoint directory")
        return targs.resume
    ckpts = sorted(Path(output_dir).glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]),
                   reverse=True) if Path(output_dir).is_dir() else []
    for ckpt in ckpts:
        if (ckpt / "trainer_state.json").is_file() and any(ckpt.glob("adapter_model.safetensors")):
            return str(ckpt)
    raise UsageError(f"--resume: no complete checkpoint in {output_dir}; run without --resume to start")


# ---------------------------------------------------------------- the run


def run(targs: TrainArguments, cfg: Any) -> dict[str, Any]:
    """Everything after parsing; returns the summary as a dict (also printed)."""
    from slimrl import FastLanguageModel
    from slimrl.patching import trainer_and_config

    algorithm = targs.algorithm
    trainer_cls = trainer_and_config(algorithm)[0]  # patched by parse()
    validate(targs, cfg)
    rewards = load_rewards(targs.reward)
    train_ds, eval_ds = load_dataset_arg(targs, cfg.seed, trainer_cls, cfg)
    resume_from = resolve_resume(targs, cfg.output_dir)

    import torch

    from slimrl.cli.report import (
        PLOTTED,
        PLOTTED_OFFLINE,
        MetricsFileCallback,
        fmt_change,
        mean_of,
        plot_metrics,
        read_metrics,
        summary_table,
        use_step_lines,
    )
    from slimrl.compat.memory import peak_window

    run_window = peak_window(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    window = run_window.__enter__()  # the run's peak, through every step's own window

    t_start = time.time()
    model, tokenizer = FastLanguageModel.from_pretrained(
        targs.model, max_seq_length=targs.max_seq_length, load_in_4bit=targs.load_in_4bit,
        fast_inference=targs.fast_inference, max_lora_rank=targs.lora_r,
        gpu_memory_utilization=memory_fraction(targs.gpu_memory_utilization))
    gc_mode: str | bool = {"true": True, "false": False}.get(targs.use_gradient_checkpointing.lower(),
                                                              targs.use_gradient_checkpointing.lower())
    model = FastLanguageModel.get_peft_model(model, r=targs.lora_r, lora_alpha=targs.lora_alpha,
                                             lora_dropout=targs.lora_dropout, use_gradient_checkpointing=gc_mode,
                                             random_state=cfg.seed)
    out = Path(cfg.output_dir)
    before = greedy_eval(model, tokenizer, eval_ds, rewards, targs.eval_max_new_tokens) if eval_ds else None
    online = {"reward_funcs": rewards} if algorithm in ONLINE else {}
    trainer = trainer_cls(model=model, args=cfg, train_dataset=train_ds, processing_class=tokenizer,
                          callbacks=[MetricsFileCallback(out)], **online)
    use_step_lines(trainer)
    trainer.train(resume_from_checkpoint=resume_from)
    after = greedy_eval(model, tokenizer, eval_ds, rewards, targs.eval_max_new_tokens) if eval_ds else None
    adapter_dir = out / "adapter"
    trainer.save_model(str(adapter_dir))
    tokenizer.save_pretrained(str(adapter_dir))
    rows = read_metrics(out / "metrics.jsonl")
    plot = plot_metrics(rows, out / "metrics.png", PLOTTED if algorithm in ONLINE else PLOTTED_OFFLINE)
    key = rewards[0].__name__
    summary = {
        "steps": trainer.state.global_step,
        "time_s": time.time() - t_start,
        "peak_memory_mb": window.peak_bytes() / 2**20,
        "algorithm": algorithm,
        "train_reward_start": mean_of(rows, "reward", first=True),
        "train_reward_end": mean_of(rows, "reward", first=False),
        "train_loss_start": mean_of(rows, "loss", first=True),
        "train_loss_end": mean_of(rows, "loss", first=False),
        "eval_before": before,
        "eval_after": after,
        "adapter": str(adapter_dir),
        "metrics": str(out / "metrics.jsonl"),
        "plot": str(plot) if plot else None,
        "resumed_from": resume_from,
    }
    items = [
        ("algorithm", algorithm),
        ("steps", summary["steps"]),
        ("time", f"{summary['time_s']:.0f} s"),
        ("peak memory", f"{summary['peak_memory_mb']:.0f} MB"),
    ]
    if algorithm in ONLINE:
        items.append(("train reward (first 5 -> last 5 steps)", fmt_change(summary["train_reward_start"],
                                                                           summary["train_reward_end"])))
    else:
        items.append(("train loss (first 5 -> last 5 steps)", fmt_change(summary["train_loss_start"],
                                                                         summary["train_loss_end"])))
    if before and after:
        items += [(f"held-out {key} (greedy, {len(eval_ds)} rows)", fmt_change(before[key], after[key])),
                  ("held-out total reward (greedy)", fmt_change(before["reward"], after["reward"]))]
    items += [("adapter + tokenizer", adapter_dir), ("checkpoints", f"{out}/checkpoint-*"),
              ("metrics", f"{out}/metrics.jsonl, metrics.csv"), ("plot", plot or "matplotlib not installed")]
    if resume_from:
        items.append(("resumed from", resume_from))
    print("\nslimrl train: summary\n" + summary_table(items), flush=True)
    run_window.__exit__(None, None, None)
    return summary


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        targs, cfg = parse(argv)
        run(targs, cfg)
    except UsageError as err:
        print(f"slimrl train: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("slimrl train: interrupted; the checkpoints written so far are intact: continue with "
              "`slimrl train --resume` (same options)", file=sys.stderr)
        return 130
    return 0
