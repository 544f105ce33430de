"""Length settings that follow from ``FastLanguageModel.from_pretrained(max_seq_length=...)``, as Unsloth derives
them, where the user set none.

Unsloth's trainer wrapper (``unsloth/models/rl.py``, its max-length block, read at unslothai/unsloth 015bdef)
copies the model's ``max_seq_length`` into one TRL setting only: SFT's ``max_length`` (TRL's default 1,024 would cut
every longer row). GRPO/RLOO keep ``max_seq_length`` as slimrl's own budget field
(:func:`slimrl.patching.every_trainer.validation.check_sequence_budget`); Unsloth derives no prompt or completion limit
of the preference trainers from the model. Where slimrl differs from Unsloth: a ``max_length`` the user gave is kept
(Unsloth overwrites it with ``max_seq_length``). A value at TRL's own default counts as not given, as the precision
flags do (:mod:`slimrl.patching.every_trainer.defaults`: TRL's argument parser passes every field); ``max_length=None``
(no truncation) is a value and is kept. The change is a row of the changed-settings table.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slimrl.patching.every_trainer.state import config_state
from slimrl.patching.every_trainer.validation import model_max_seq_length

# trainer config field <- the model's max_seq_length (Unsloth's rl.py: SFT only)
DERIVED = {"sft": ("max_length",)}


def lengths_from_model(algorithm: str, model: Any, args: Any) -> None:
    """``hook(model, args)`` of the trainers in :data:`DERIVED` (module docstring)."""
    limit = model_max_seq_length(model)
    if limit is None or args is None or not dataclasses.is_dataclass(args):
        return
    for name in DERIVED.get(algorithm, ()):
        default = getattr(type(args).__dataclass_fields__.get(name), "default", dataclasses.MISSING)  # TRL's
        value = getattr(args, name, dataclasses.MISSING)
        if default is dataclasses.MISSING or value != default or value == limit:
            continue
        setattr(args, name, limit)
        config_state(args).changed[name] = (
            value,
            f"{limit} (the model's max_seq_length, from from_pretrained; pass {name}= to keep another)",
        )


def sft_lengths_from_model(model: Any, args: Any) -> None:
    """SFT's hook: ``max_length`` from the model's ``max_seq_length`` where the user set none."""
    lengths_from_model("sft", model, args)
