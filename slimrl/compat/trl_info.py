"""Facts about the installed TRL that the patches and tests need (read from TRL's objects, never its source)."""

from __future__ import annotations

import re
from importlib.metadata import version

from packaging.version import Version

from slimrl.compat.runtime.callsite import warn

SUPPORTED_TRL = ">=1.12.0,<1.17"
# The releases `make test` runs `slimrl verify --all --tiny` on (each in its own virtual environment).
TESTED_TRL = ("1.12.0", "1.13.0", "1.14.2", "1.15.0", "1.16.0")
# What TRL has where, as PEP 440 specifiers over the installed release (patches declare them as their `versions`).
EVERY_RELEASE = ">=1.12"  # every supported release
UNTIL_1_12 = "<1.13"  # PPO (trl.experimental.ppo) was removed after 1.12.0
UNTIL_1_13 = "<1.14"  # BCO, XPO and PRM were removed after 1.13.0
FUSED_HEAD = ">=1.15"  # the fused LM head (trl/kernels, add_fused_lm_head) and its users' fused forward


def trl_version() -> Version:
    return Version(version("trl"))


def newest_tested() -> Version:
    """The newest release of :data:`TESTED_TRL`."""
    return max(Version(v) for v in TESTED_TRL)


def has(releases: str) -> bool:
    """Whether the installed TRL is in ``releases`` (one of the specifiers above)."""
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(releases).contains(trl_version(), prereleases=True)


def has_fused_head() -> bool:
    """Whether the installed TRL has the fused LM head (read from its version, without importing TRL)."""
    return has(FUSED_HEAD)


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
    """Warn once (at ``import slimrl``) when the installed TRL is older than :data:`SUPPORTED_TRL`, or newer than
    the releases slimrl is tested on (:data:`TESTED_TRL`: then ``slimrl verify`` proves the patch on it, and any
    trainer whose replaced methods are gone is refused by name); returns whether it is a tested release."""

    from packaging.specifiers import SpecifierSet

    installed = installed or trl_version()
    newest = newest_tested()
    if installed > newest and installed.release[:2] != newest.release[:2]:
        warn(
            f"trl {installed} is newer than the releases slimrl is tested with ({', '.join(TESTED_TRL)}): "
            f"each trainer's tiny parity row runs before its patches go in (once per version set; "
            f"SLIMRL_SELF_CHECK=0 skips it), a call a patch was not written for goes to TRL's own method, and a "
            f"trainer whose replaced methods are gone is refused by name",
            UserWarning,
        )
        return False
    if not SpecifierSet(SUPPORTED_TRL).contains(installed, prereleases=True):
        warn(
            f"slimrl supports trl {SUPPORTED_TRL}; the installed trl {installed} is outside that range, so "
            f"its trainers may not match slimrl's patches: pip install 'trl{SUPPORTED_TRL}'",
            UserWarning,
        )
        return False
    return True
