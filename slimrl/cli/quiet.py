"""The ``slimrl`` command's own output: third-party deprecation warnings the user cannot act on (TRL, PEFT and
transformers calling each other's deprecated methods, e.g. transformers' ``gradient_checkpointing_*`` notices)
are filtered, by category and by the module that raises them, in the command only — a library user's own warning
filters are never touched (nothing here runs on ``import slimrl``)."""

from __future__ import annotations

import warnings

THIRD_PARTY = r"(transformers|peft|trl|accelerate|datasets|torch|huggingface_hub)(\.|$)"


def quiet_third_party() -> None:
    """Hide ``FutureWarning``/``DeprecationWarning`` raised from the libraries slimrl drives (:data:`THIRD_PARTY`)."""
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category, module=THIRD_PARTY)
