"""``slimrl train``'s range checks, run before the model loads: values that cannot run (they stop the run after
minutes of loading, or hang, or train nonsense without a word) are one :class:`InputError` line naming the flag,
the value and why. These are the command line's checks only: the Python API refuses nothing TRL accepts.

What counts as "cannot run", per option: a count below 1 (a batch of -1 rows, -1 accumulation steps, -1 saves
apart), a value no loss, sampler or schedule is defined for (a ``top_p`` outside (0, 1], an unknown ``loss_type``),
a size beyond anything one machine can hold (the built-in task generates every problem it is asked for: 10**20 of
them never finish), a number that is not finite.
"""

from __future__ import annotations

import json
import math
from typing import Any

from slimrl.errors import InputError

# what one machine can hold: the built-in task makes every problem up front; ranks and lengths past these are
# beyond any model's width or context
MAX_PROBLEMS = 10**7
MAX_RANK = 65536
MAX_TOKENS = 2**24
MAX_THREADS = 4096
MAX_GENERATIONS = 2**16

FIXED_AFTER = ("per_device_train_batch_size",)  # counts the library may change before the command line sees them
# values TRL checks only when the step runs (its help text lists none): GRPO/RLOO's reward scaling
RUNTIME_CHOICES = {"scale_rewards": ("group", "batch", "none")}
COUNTS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "num_iterations",
    "max_completion_length",
    "max_length",
    "max_steps",
)  # config fields that are counts >= 1 where set


def _count(flag: str, value: Any, upper: int | None = None, why: str = "") -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InputError(f"--{flag} {value}: a count >= 1{why}")
    if upper is not None and value > upper:
        raise InputError(f"--{flag} {value}: over {upper}, beyond what one machine can hold{why}")


def _number(flag: str, value: Any, low: float, high: float, low_open: bool = False, what: str = "") -> None:
    if value is None:
        return
    ok = (
        isinstance(value, int | float)
        and math.isfinite(value)
        and (value > low if low_open else value >= low)
        and value <= high
    )
    if not ok:
        bound = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise InputError(f"--{flag} {value}: {what or 'a number'} in {bound}")


def check_task(task: str, tasks: tuple[str, ...]) -> None:
    if task not in tasks:
        raise InputError(f"--task {task!r}: the built-in tasks are {', '.join(tasks)}")


def check_options(targs: Any) -> None:
    """slimrl's own options (:class:`slimrl.cli.args.TrainArguments`)."""
    _count("lora_r", targs.lora_r, MAX_RANK, " (the LoRA rank)")
    _number(
        "lora_alpha",
        targs.lora_alpha,
        0,
        1e6,
        low_open=True,
        what="the LoRA scale's numerator (alpha / r; <= 0 reverses or erases the adapter's update), a number",
    )
    _number("lora_dropout", targs.lora_dropout, 0, 1, what="a dropout probability (1 drops everything: < 1),")
    if targs.lora_dropout == 1:
        raise InputError("--lora_dropout 1.0: every adapter input would be dropped; a probability below 1")
    _count("max_seq_length", targs.max_seq_length, MAX_TOKENS, " (tokens)")
    _count("threads", targs.threads, MAX_THREADS)
    if targs.dataset is None:
        _count("train_size", targs.train_size, MAX_PROBLEMS, " (the built-in task makes every problem first)")
    if targs.eval_size:
        _count("eval_size", targs.eval_size, MAX_PROBLEMS, " (0 skips the evaluation)")


def check_config(cfg: Any, config_cls: type) -> None:
    """The algorithm's config fields that would stop the run only after the model loads, or train nonsense."""
    from slimrl.compat.trl_info import config_choices

    if not str(cfg.output_dir or "").strip():
        raise InputError("--output_dir '': an empty path; pass the folder to write the run to")
    from slimrl.patching.every_trainer.validation import unsloth_refusals

    refused = unsloth_refusals(
        {name: getattr(cfg, name, None) for name in ("learning_rate", "temperature", "max_completion_length")}
    )
    if refused:  # the library accepts what TRL accepts; the command runs only what makes sense
        raise InputError(refused[0])
    for name in COUNTS:
        if hasattr(cfg, name) and not (name == "max_steps" and cfg.max_steps == -1):
            _count(name, getattr(cfg, name), MAX_GENERATIONS if name == "num_generations" else None)
    if cfg.save_strategy == "steps" or str(cfg.save_strategy).endswith("STEPS"):
        _number(
            "save_steps",
            cfg.save_steps,
            0,
            math.inf,
            low_open=True,
            what="steps between checkpoints (--save_strategy no saves none),",
        )
    _number(
        "learning_rate",
        cfg.learning_rate,
        0,
        1,
        low_open=True,
        what="a learning rate (above 1 every step overshoots: weights go to inf/NaN),",
    )
    for name, low, high, low_open in (
        ("top_p", 0, 1, True),
        ("min_p", 0, 1, False),
        ("epsilon", 0, 10, False),
        ("epsilon_high", 0, 10, False),
        ("temperature", 0, 100, True),
        ("beta", 0, 1e6, False),
    ):
        if getattr(cfg, name, None) is not None:
            _number(name, getattr(cfg, name), low, high, low_open)
    if getattr(cfg, "top_k", None) is not None and cfg.top_k < -1:
        raise InputError(f"--top_k {cfg.top_k}: a count of tokens >= 0 (0 or -1: no top-k)")
    for name in ("loss_type", "scale_rewards", "importance_sampling_level"):
        value = getattr(cfg, name, None)
        choices = (
            (config_choices(config_cls, name) or list(RUNTIME_CHOICES.get(name, ())))
            if name in config_cls.__dataclass_fields__
            else []
        )
        if isinstance(value, str) and choices and value not in choices:
            raise InputError(f"--{name} {value}: {config_cls.__name__} takes {', '.join(choices)}")
    kwargs = getattr(cfg, "generation_kwargs", None)
    if isinstance(kwargs, str):
        try:
            parsed = json.loads(kwargs)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise InputError(f"--generation_kwargs {kwargs}: a JSON object, e.g. '{{\"top_k\": 50}}'")


def raw_options(argv: list[str]) -> list[tuple[str, str]]:
    """``(name, value)`` of each ``--option`` as written, the name in its underscore spelling (argparse takes
    ``--accelerator-config`` for ``--accelerator_config``: every spelling gets the same check)."""
    out = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg[2:].partition("=")
        if not eq and i + 1 < len(argv):
            value = argv[i + 1]
        out.append((name.replace("-", "_"), value))
    return out


def check_raw_counts(argv: list[str], yaml_data: dict[str, Any]) -> None:
    """The counts as the user wrote them (the library may fix a batch to ``num_generations`` after the fact, as
    Unsloth does; a batch of -1 is still a mistake worth one line)."""
    given = dict(yaml_data)
    for name, value in raw_options(argv):
        if name in FIXED_AFTER:
            given[name] = value
    for name in FIXED_AFTER:
        value = given.get(name)
        try:
            number = int(str(value))
        except ValueError:
            continue
        if number < 1 and not (name == "max_steps" and number == -1):
            raise InputError(f"--{name} {number}: a count >= 1")


FILE_OPTIONS = ("accelerator_config", "deepspeed", "fsdp_config")  # JSON files transformers opens while parsing


def check_raw_paths(argv: list[str], yaml_data: dict[str, Any]) -> None:
    """A file option (:data:`FILE_OPTIONS`, any spelling) that names no regular file (a FIFO would block the parse
    forever; a missing one is transformers' traceback) or is not a JSON object: one line."""
    import os
    import stat

    given = {k: v for k, v in yaml_data.items() if k in FILE_OPTIONS}
    for name, value in raw_options(argv):
        if name in FILE_OPTIONS:
            given[name] = value
    for name, value in given.items():
        if isinstance(value, dict) or value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"--{name} {value!r}: pass a JSON file or a JSON object")
        if value.lstrip().startswith(("{", "[")):
            try:
                parsed = json.loads(value)
            except ValueError as err:
                raise InputError(f"--{name} {value}: not valid JSON ({err})") from None
            if not isinstance(parsed, dict):
                raise InputError(f"--{name} {value}: a JSON object ({{...}}), not a {type(parsed).__name__}")
            continue
        try:
            mode = os.stat(os.path.expanduser(value)).st_mode
        except OSError as err:
            raise InputError(f"--{name} {value}: {err.strerror.lower()}; pass a JSON file or a JSON object") from None
        if not stat.S_ISREG(mode):
            raise InputError(
                f"--{name} {value}: not a regular file (a pipe or a device would block the run); pass a JSON file"
            )
