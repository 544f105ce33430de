"""CPU memory: make glibc's malloc return large freed blocks to the OS.

PyTorch's CPU allocator is plain ``malloc``. glibc serves blocks below its *dynamic* mmap threshold (which grows up
to 32 MiB as large blocks are freed) from arenas that it rarely gives back, so after a few forward/backward passes
the resident set stays near the sum of every temporary ever live at once, fragmented. Measured on SmolLM2-135M,
8 x 542 tokens, LoRA, checkpointed forward + backward: tensors saved for backward are 0.4 GB, yet peak RSS is
5.2 GB with the default, 1.5 GB with a fixed 1 MiB threshold (docs/BENCHMARKS.md).

:func:`tune_malloc` fixes ``M_MMAP_THRESHOLD`` (blocks at least that large are ``mmap``-ed and unmapped on free).
The cost is a page fault per fresh page of such blocks (visible in the backward, see BENCHMARKS.md). It is applied
by ``PatchFastRL`` on Linux/glibc when no CUDA device is used; ``SLIMRL_MALLOC_TUNING=0`` turns it off and
``SLIMRL_MMAP_THRESHOLD`` (bytes) changes the threshold. It cannot be undone for blocks already placed, and
``unpatch`` leaves it in place (it changes no numerics).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_MMAP_THRESHOLD = -3
DEFAULT_THRESHOLD = 1 << 20

_applied: int | None = None


def tune_malloc(threshold: int | None = None) -> int | None:
    """Set glibc's mmap threshold (bytes); returns the value in force, or None where it does not apply."""
    global _applied
    if os.environ.get("SLIMRL_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    if threshold is None:
        threshold = int(os.environ.get("SLIMRL_MMAP_THRESHOLD", DEFAULT_THRESHOLD))
    if _applied == threshold:
        return _applied
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc without mallopt
        return None
    if mallopt(M_MMAP_THRESHOLD, int(threshold)) != 1:
        return None
    _applied = threshold
    return _applied


def cpu_training() -> bool:
    """True when no CUDA device is in use, i.e. the trainer's tensors live in host memory."""
    import torch

    return not torch.cuda.is_available()
