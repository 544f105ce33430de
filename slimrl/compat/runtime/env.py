"""Yes/no switches read from the environment (``SLIMRL_STRICT``, ``SLIMRL_AUTOPATCH``, ``HF_HUB_OFFLINE``, ...)."""

from __future__ import annotations

import os

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def env_flag(name: str, default: bool = False) -> bool:
    """``name`` read as a switch: with ``default`` False only 1/true/yes/on turn it on; with ``default`` True only
    0/false/no/off turn it off (case and surrounding spaces ignored; unset is ``default``)."""
    value = os.environ.get(name, "").strip().lower()
    return value not in _OFF if default else value in _ON
