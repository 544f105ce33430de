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


def check_trl_supported(installed: Version | None = None) -> bool:
    """Warn (once, at ``import slimrl``) when the installed TRL is outside :data:`SUPPORTED_TRL`; returns whether
    it is inside. slimrl's patches name TRL methods of the supported releases; outside the range they may be
    missing (a patch then fails to install with TRL's own AttributeError) or mean something else."""
    import warnings

    from packaging.specifiers import SpecifierSet

    installed = installed or trl_version()
    if SpecifierSet(SUPPORTED_TRL).contains(installed, prereleases=True):
        return True
    warnings.warn(f"slimrl supports trl {SUPPORTED_TRL}; the installed trl {installed} is outside that range, so "
                  f"its trainers may not match slimrl's patches: pip install 'trl{SUPPORTED_TRL}'",
                  UserWarning, stacklevel=2)
    return False
