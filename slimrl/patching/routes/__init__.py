"""The log-prob routes (method capture, score positions, fused head); :func:`served` tells whether they ran."""

from typing import Any

from slimrl.patching.every_trainer.state import trainer_state


def served(trainer: Any) -> int:
    """How many forwards and kernel calls slimrl's log-prob routes have served for ``trainer`` (``slimrl verify``
    and the parity tests check it to prove slimrl's path ran)."""
    return trainer_state(trainer).served_calls
