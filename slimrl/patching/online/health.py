"""The run-health monitor (:mod:`slimrl.health`) on every patched GRPO/RLOO trainer, its switch and thresholds read
through the config's typed fields (``slimrl_health``, ``slimrl_health_<limit>``, ``slimrl_truncated_sampling_fix``)."""

from __future__ import annotations

from typing import Any

from slimrl.health import attach_health
from slimrl.health.checks import LIMITS, Thresholds
from slimrl.patching.every_trainer.extra_fields import fields_of


def thresholds_of(args: Any) -> Thresholds:
    """The health checks' thresholds of a config: every limit from its field."""
    fields = fields_of(args)
    limits = {name: getattr(fields, f"slimrl_health_{name}") for name in LIMITS}
    return Thresholds.from_args(args, limits, fields.slimrl_truncated_sampling_fix)


def attach_health_monitor(trainer: Any) -> None:
    """The monitor first in the trainer's callbacks, unless ``slimrl_health=False``."""
    if fields_of(trainer.args).slimrl_health:
        attach_health(trainer, thresholds_of)
