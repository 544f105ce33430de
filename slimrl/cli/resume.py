"""``--resume`` from a checkpoint that already reached ``--max_steps``: nothing is left to train.

transformers' Trainer, resumed at ``global_step == max_steps``, skips the trained batches and then runs one more
optimizer step before its stop check (TRL alone ends at ``max_steps + 1``: checked with TRL 1.16 / transformers
5.24). ``slimrl train`` instead loads that checkpoint's adapter and state and goes straight to the evaluation and
the saved adapter (a run killed after its last checkpoint gets its adapter without training past its budget).
The library leaves TRL's behaviour as it is.

Before any of that (and before any evaluation or step), :func:`check_resume_matches` holds the checkpoint against
this run: the options it was written with, and its adapter's tensors against the adapter the model now carries
(a checkpoint missing half its LoRA tensors would otherwise train on from the fresh initialisation of the rest, and
one of other shapes ends in PEFT's ``state_dict`` traceback).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def checkpoint_step(ckpt: Path) -> int:
    """The ``global_step`` a checkpoint's ``trainer_state.json`` records (checked intact before this is read)."""
    return int(json.loads((ckpt / "trainer_state.json").read_text()).get("global_step", 0))


def train_or_finish(trainer: Any, resume_from: Path | None) -> bool:
    """Trains (resuming when asked); returns False, with one line and no step, when ``resume_from`` is already at
    the config's ``max_steps``: its adapter weights and trainer state are loaded instead."""
    max_steps = trainer.args.max_steps
    if resume_from is None or max_steps <= 0 or checkpoint_step(resume_from) < max_steps:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        return True
    from transformers.trainer_callback import TrainerState

    trainer._load_from_checkpoint(str(resume_from))
    trainer.state = TrainerState.load_from_json(str(resume_from / "trainer_state.json"))
    print(
        f"slimrl train: {resume_from.name} is at step {trainer.state.global_step}, --max_steps {max_steps}: "
        f"nothing left to train (raise --max_steps to train on); saving its adapter",
        flush=True,
    )
    return False


def check_resume_matches(ckpt: Path, record: dict[str, Any], model: Any = None) -> None:
    """The checkpoint was written by a run like this one (algorithm, LoRA rank, target modules) and, given the
    model (with its adapter), holds exactly that adapter's tensors in its shapes (:func:`adapter_differences`):
    before any step, one line naming the checkpoint and what differs."""
    from slimrl.cli.outputs import RUN_FILE
    from slimrl.errors import InputError

    saved = json.loads((ckpt / RUN_FILE).read_text()) if (ckpt / RUN_FILE).is_file() else {}
    adapter = json.loads((ckpt / "adapter_config.json").read_text()) if (ckpt / "adapter_config.json").is_file() else {}
    mismatches = []
    if saved.get("algorithm") not in (None, record["algorithm"]):
        mismatches.append(f"--algorithm {saved['algorithm']} there, {record['algorithm']} now")
    rank = adapter.get("r", saved.get("lora_r"))
    if rank is not None and rank != record["lora_r"]:
        mismatches.append(f"--lora_r {rank} there, {record['lora_r']} now")
    targets = sorted(model.peft_config["default"].target_modules) if model is not None else None
    if (
        targets is not None
        and adapter.get("target_modules") is not None
        and sorted(adapter["target_modules"]) != targets
    ):
        mismatches.append(f"LoRA target modules {sorted(adapter['target_modules'])} there, {targets} now")
    if mismatches:
        raise InputError(
            f"--resume {ckpt}: the checkpoint is from a different run ({'; '.join(mismatches)}); "
            f"resume with the same options, or start over with --overwrite_output_dir true"
        )
    differences = adapter_differences(ckpt, model) if model is not None else None
    if differences:
        raise InputError(
            f"--resume {ckpt}: its adapter does not fit this model ({differences}); resume from "
            f"another checkpoint, or start over with --overwrite_output_dir true"
        )


def adapter_differences(ckpt: Path, model: Any) -> str | None:
    """What differs between the checkpoint's ``adapter_model.safetensors`` and the adapter ``model`` carries (PEFT's
    saved names: :func:`peft.get_peft_model_state_dict`): missing or extra tensors, other shapes; None when they
    match (or the checkpoint has no safetensors adapter: TRL/transformers then decide). Only the file's header is
    read."""
    from peft import get_peft_model_state_dict
    from safetensors import safe_open

    path = ckpt / "adapter_model.safetensors"
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 - safe_open has no __iter__
    wanted = {k: tuple(v.shape) for k, v in get_peft_model_state_dict(model).items()}
    missing, extra = sorted(wanted.keys() - saved.keys()), sorted(saved.keys() - wanted.keys())
    shapes = sorted(k for k in wanted.keys() & saved.keys() if wanted[k] != saved[k])
    parts = []
    if missing:
        parts.append(f"{len(missing)} of the model's {len(wanted)} LoRA tensors missing, e.g. {missing[0]}")
    if extra:
        parts.append(f"{len(extra)} tensors this model has no place for, e.g. {extra[0]}")
    if shapes:
        parts.append(
            f"{len(shapes)} of another shape, e.g. {shapes[0]}: {list(saved[shapes[0]])} there, "
            f"{list(wanted[shapes[0]])} now"
        )
    return "; ".join(parts) or None
