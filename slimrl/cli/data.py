"""``slimrl train``'s inputs besides the model: reward functions (``--reward module:function``) and the dataset
(``--dataset`` file or cached name, else the built-in arithmetic task), checked with the trainer's own column rules
(:func:`slimrl.patching.every_trainer.validation.check_layout`) before any model loads."""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slimrl.cli.args import ONLINE, TrainArguments
from slimrl.errors import InputError
from slimrl.patching.table import CLI_KINDS

DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_rewards(specs: list[str] | None, task: str = "arithmetic") -> list[Callable]:
    """``--reward`` specs as callables (the built-in task's two rewards when unset)."""
    from slimrl.cli.tasks import task_of

    if not specs:
        return task_of(task).rewards()
    funcs = []
    for spec in [s for item in specs for s in item.split(",") if s]:
        module_name, _, attr = spec.partition(":")
        if not module_name or not attr:
            raise InputError(f"--reward {spec!r}: write it as module:function (e.g. my_rewards:score)")
        try:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
        except Exception as err:  # noqa: BLE001  (any import failure is the user's module)
            raise InputError(
                f"--reward {spec!r}: cannot import module {module_name!r} ({err}); check the name "
                f"and that it is on PYTHONPATH"
            ) from None
        finally:
            sys.path.pop(0)
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise InputError(
                f"--reward {spec!r}: {module_name}.{attr} is missing or not callable; pass a function "
                f"f(prompts, completions, **kwargs) -> list[float]"
            )
        funcs.append(fn)
    return funcs


def _check_json_lines(path: Path, name: str) -> None:
    """A JSON Lines file: every non-empty line one JSON object (the first bad line named)."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(
                    f"--dataset {name}: line {number} is not valid JSON ({err.msg}); fix or remove that line"
                ) from None
            if not isinstance(row, dict):
                raise InputError(f'--dataset {name}: line {number} is not a JSON object ({{"prompt": ...}})')


def _read_file(path: Path, name: str):
    import datasets

    suffix = path.suffix.lower()
    if suffix == ".jsonl" or suffix == ".json" and path.read_bytes()[:1] not in (b"[", b"{"):
        _check_json_lines(path, name)
    try:
        return datasets.load_dataset(DATA_SUFFIXES[suffix], data_files=str(path), split="train")
    except Exception as err:  # noqa: BLE001  (a malformed file: name it in one line)
        if "corresponds to no data" in str(err):  # datasets' words for a file without rows ([], a CSV header)
            raise InputError(f"--dataset {name}: the file has no rows; it needs at least one") from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"--dataset {name}: cannot read it as {DATA_SUFFIXES[suffix]} ({first[:200]})") from None


def load_dataset_arg(targs: TrainArguments, seed: int, trainer_cls: type, cfg: Any):
    """(train, eval or None). Built-in task when ``--dataset`` is unset (offline algorithms: its answers as
    preference pairs / labelled examples / demonstrations; the held-out eval is the same problems' prompts).
    A user dataset must have rows and a column layout the trainer accepts."""
    from slimrl.cli.tasks import make_datasets
    from slimrl.data import make_preference_dataset
    from slimrl.patching.every_trainer.validation import check_layout
    from slimrl.patching.table import trainer_layouts

    algorithm = targs.algorithm
    if targs.dataset is None:
        train, held = make_datasets(targs.task, targs.train_size, targs.eval_size, seed)
        if algorithm not in ONLINE:
            train = make_preference_dataset(targs.train_size, kind=CLI_KINDS[algorithm], seed=seed)
        return train, held
    import datasets

    datasets.disable_progress_bars()  # local files load in a blink; keep the error output to one line
    path = Path(targs.dataset).expanduser()
    if path.suffix.lower() in DATA_SUFFIXES:
        if not path.is_file():
            raise InputError(
                f"--dataset {targs.dataset}: file not found; pass an existing "
                f"{'/'.join(sorted(set(DATA_SUFFIXES)))} file"
            )
        if path.stat().st_size == 0:
            raise InputError(f"--dataset {targs.dataset}: the file is empty; it needs at least one row")
        ds = _read_file(path, targs.dataset)
    else:
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        try:
            ds = datasets.load_dataset(targs.dataset, split="train")
        except Exception as err:  # noqa: BLE001
            raise InputError(
                f"--dataset {targs.dataset}: not a JSON/JSONL/CSV/parquet file nor a dataset in the "
                f"local cache ({type(err).__name__}); pass a file path"
            ) from None
    if len(ds) == 0:
        raise InputError(f"--dataset {targs.dataset}: the dataset has no rows; it needs at least one")
    try:
        check_layout(ds, *trainer_layouts(trainer_cls, cfg), cfg, argument=f"--dataset {targs.dataset}")
    except ValueError as err:
        raise InputError(f"{err} (--algorithm {algorithm})") from None
    if algorithm not in ONLINE:
        return ds, None  # a held-out greedy eval needs reward functions for the user's task: none given
    n_eval = min(targs.eval_size, len(ds) // 4)
    if n_eval > 0:
        return ds.select(range(len(ds) - n_eval)), ds.select(range(len(ds) - n_eval, len(ds)))
    return ds, None


def _prompt_ids(tokenizer, prompt) -> list[int]:
    """Token ids of one prompt as GRPO/RLOO build them (chat template with the generation prompt for a
    conversation; no special tokens added to plain text)."""
    if isinstance(prompt, str):
        return tokenizer(prompt, add_special_tokens=False)["input_ids"]
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _shorten(tokenizer, prompt, budget: int):
    """``prompt`` cut to ``budget`` tokens: plain text keeps its last tokens; a conversation loses its oldest
    non-system messages (None when even its last message does not fit)."""
    if isinstance(prompt, str):  # cut the text where its last `budget` tokens start (no decode round trip)
        if getattr(tokenizer, "is_fast", False):
            offsets = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            return prompt[offsets[-budget][0] :]
        return tokenizer.decode(_prompt_ids(tokenizer, prompt)[-budget:])
    messages = list(prompt)
    while len(_prompt_ids(tokenizer, messages)) > budget:
        drop = next((i for i, m in enumerate(messages[:-1]) if m.get("role") != "system"), None)
        if drop is None:
            return None
        messages.pop(drop)
    return messages


def fit_prompts(ds, tokenizer, targs: TrainArguments, completion: int, name: str):
    """Prompts must leave ``completion`` tokens within ``--max_seq_length``: checked on the tokenized dataset
    before the model loads. Too long: one line with how many and the longest (and the two ways out), or, with
    ``--truncate_prompts`` / ``--drop_long_prompts``, the fixed dataset (and a line saying what was done)."""
    budget = targs.max_seq_length - completion
    lengths = [len(_prompt_ids(tokenizer, p)) for p in ds["prompt"]]
    long_rows = [i for i, n in enumerate(lengths) if n > budget]
    if not long_rows:
        return ds
    worst = max(long_rows, key=lambda i: lengths[i])
    what = (
        f"{len(long_rows)} of {len(ds)} prompts are longer than the {budget} tokens that --max_seq_length "
        f"{targs.max_seq_length} - --max_completion_length {completion} leave (longest: {lengths[worst]} "
        f"tokens, row {worst})"
    )
    if targs.drop_long_prompts:
        if len(long_rows) == len(ds):
            raise InputError(f"--dataset {name}: every prompt is too long ({what}); raise --max_seq_length")
        print(f"slimrl train: dropped {what.split(' are ')[0]} that are too long", flush=True)
        keep = sorted(set(range(len(ds))) - set(long_rows))
        return ds.select(keep)
    if targs.truncate_prompts:
        short = {i: _shorten(tokenizer, ds[i]["prompt"], budget) for i in long_rows}
        if any(p is None for p in short.values()):
            raise InputError(
                f"--dataset {name}: {what}; a conversation's last message alone is over the budget: "
                f"use --drop_long_prompts true or raise --max_seq_length"
            )
        print(f"slimrl train: truncated {len(long_rows)} prompts to {budget} tokens", flush=True)
        return ds.map(lambda row, i: {"prompt": short.get(i, row["prompt"])}, with_indices=True)
    raise InputError(
        f"--dataset {name}: {what}; pass --truncate_prompts true, --drop_long_prompts true, or raise --max_seq_length"
    )
