"""``--resume`` from a checkpoint that already reached ``--max_steps``: nothing is left to train.

transformers' Trainer, resumed at ``global_step == max_steps``, skips the trained batches and then runs one more
optimizer step before its stop check (TRL alone ends at ``max_steps + 1``: checked with TRL 1.16 / transformers
5.24). ``slimrl train`` instead loads that checkpoint's adapter and state and goes straight to the evaluation and
the saved adapter (a run killed after its last checkpoint gets its adapter without training past its budget).
The library leaves TRL's behaviour as it is.
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
    print(f"slimrl train: {resume_from.name} is at step {trainer.state.global_step}, --max_steps {max_steps}: "
          f"nothing left to train (raise --max_steps to train on); saving its adapter", flush=True)
    return False
