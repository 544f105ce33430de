"""CPU memory: make glibc's malloc return large freed blocks to the OS.

PyTorch's CPU allocator is plain ``malloc``. glibc serves blocks below its *dynamic* mmap threshold (which grows up
to 32 MiB as large blocks are freed) from arenas that it rarely gives back, so after a few forward/backward passes
the resident set stays near the sum of every temporary ever live at once, fragmented. Measured on SmolLM2-135M,
8 x 542 tokens, LoRA, checkpointed forward + backward: tensors saved for backward are 0.4 GB, yet peak RSS is
5.2 GB with the default, 1.5 GB with a fixed 1 MiB threshold (docs/BENCHMARKS.md).

:func:`tune_malloc` fixes ``M_MMAP_THRESHOLD`` (blocks at least that large are ``mmap``-ed and unmapped on free).
The cost is a page fault per fresh page of such blocks (visible in the backward, see BENCHMARKS.md), so
generation and every no-grad pass run under :func:`recycling_phase`, which recycles heap blocks instead and trims
the heap afterwards. It is applied by ``PatchFastRL`` on Linux/glibc when no CUDA device is used;
``SLIMRL_MALLOC_TUNING=0`` turns it off and ``SLIMRL_MMAP_THRESHOLD`` (bytes) changes the threshold. ``unpatch``
leaves it in place (it changes no numerics).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

M_MMAP_THRESHOLD = -3
DEFAULT_THRESHOLD = 1 << 20
# During generation the KV cache grows by a few MiB per token and layer: those blocks must be recycled from the
# heap, not mmap-ed and page-faulted afresh each token (measured: +36% generation time with 1 MiB). 32 MiB is
# glibc's own ceiling for its dynamic threshold.
RECYCLING_THRESHOLD = 32 << 20

_applied: int | None = None
_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.mallopt, libc.malloc_trim  # noqa: B018  (both must exist: glibc)
        except (OSError, AttributeError):  # musl or another libc without them
            return None
        _libc = libc
    return _libc


def tune_malloc(threshold: int | None = None) -> int | None:
    """Set glibc's mmap threshold (bytes); returns the value in force, or None where it does not apply."""
    global _applied
    if os.environ.get("SLIMRL_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    if threshold is None:
        threshold = int(os.environ.get("SLIMRL_MMAP_THRESHOLD", DEFAULT_THRESHOLD))
    if _applied == threshold:
        return _applied
    libc = _load_libc()
    if libc is None or libc.mallopt(M_MMAP_THRESHOLD, int(threshold)) != 1:
        return None
    _applied = threshold
    return _applied


@contextmanager
def recycling_phase() -> Iterator[None]:
    """Around generation and no-grad passes: recycle heap blocks (32 MiB threshold), then trim the heap and go
    back to the lean threshold for the gradient passes. These phases keep nothing alive across layers or tokens
    but the KV cache, so the heap does not fragment; what it grows to is handed back by ``malloc_trim``.
    A no-op when :func:`tune_malloc` is not in force."""
    libc = _libc if _applied is not None else None
    if libc is None:
        yield
        return
    libc.mallopt(M_MMAP_THRESHOLD, RECYCLING_THRESHOLD)
    try:
        yield
    finally:
        libc.malloc_trim(0)  # give the free pages inside the heap back (madvise), not only its top
        libc.mallopt(M_MMAP_THRESHOLD, _applied)


def cpu_training() -> bool:
    """True when no CUDA device is in use, i.e. the trainer's tensors live in host memory."""
    import torch

    return not torch.cuda.is_available()
