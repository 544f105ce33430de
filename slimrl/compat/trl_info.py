"""Facts about the installed TRL that the patches and tests need (read from TRL's objects, never its source)."""

from __future__ import annotations

import re
from importlib.metadata import version

from packaging.version import Version

SUPPORTED_TRL = ">=1.12.0,<1.17"


def trl_version() -> Version:
    return Version(version("trl"))


def grpo_loss_types() -> list[str]:
    """The ``loss_type`` values the installed ``GRPOConfig`` documents (e.g. 8 in TRL 1.16)."""
    from trl import GRPOConfig

    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata.get("help", "")
    head = help_text.split("Supported values are", 1)[-1].split(". ", 1)[0]
    found = re.findall(r"'([a-z_]+)'", head)
    return found or ["grpo", "bnpo", "dr_grpo", "dapo"]


def config_choices(config: type, field: str = "loss_type") -> list[str]:
    """The values a TRL config field accepts: its ``choices`` metadata, else the ``'x'`` names its help lists."""
    meta = config.__dataclass_fields__[field].metadata
    if meta.get("choices"):
        return list(meta["choices"])
    help_text = meta.get("help", "")
    head = re.split(r"[Pp]ossible values are:?|Supported values are:?", help_text, maxsplit=1)[-1]
    return re.findall(r"'([a-z_0-9]+)'", head.split(". ", 1)[0])
