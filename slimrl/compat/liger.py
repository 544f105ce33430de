"""Whether Liger-Kernel is installed (the ``gpu`` extra: ``liger-kernel``), without importing it (it imports Triton)."""

from __future__ import annotations

import importlib.util


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None
