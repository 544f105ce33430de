"""CPU memory: make glibc's malloc return large freed blocks to the OS.

PyTorch's CPU allocator is plain ``malloc``. glibc serves blocks below its *dynamic* mmap threshold (which grows up
to 32 MiB as large blocks are freed) from arenas that it rarely gives back, so after a few forward/backward passes
the resident set stays near the sum of every temporary ever live at once, fragmented, far above the tensors alive
at any moment (the measurement is in docs/BENCHMARKS.md).

:func:`tune_malloc` fixes ``M_MMAP_THRESHOLD`` (blocks at least that large are ``mmap``-ed and unmapped on free).
The cost is a page fault per fresh page of such blocks (visible in the backward, see BENCHMARKS.md), so
generation and every no-grad pass run under :func:`recycling_phase`, which recycles heap blocks instead and trims
the heap afterwards. It is applied by ``PatchFastRL`` on Linux/glibc when no CUDA device is used;
``SLIMRL_MALLOC_TUNING=0`` turns it off and ``SLIMRL_MMAP_THRESHOLD`` (bytes) changes the threshold. ``unpatch``
leaves it in place (it changes no numerics).

Those page faults are 4 KiB each: a 26 MiB activation costs ~6,600 of them every time it is allocated.
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc >= 2.35) puts malloc's mmap-ed blocks on transparent huge pages
(2 MiB faults: far fewer of them; BENCHMARKS.md has the measurement). glibc reads it only at
process start, so ``slimrl train`` restarts itself once with it (:func:`restart_with_huge_pages`); a Python script
gets it by being started with that variable set (docs/train.md).
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
# heap, not mmap-ed and page-faulted afresh each token (a small threshold slows generation down). 32 MiB is
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


def _tuning_allowed() -> bool:
    """Linux, and the user did not turn slimrl's malloc tuning off (``SLIMRL_MALLOC_TUNING=0``)."""
    return os.environ.get("SLIMRL_MALLOC_TUNING", "1") != "0" and sys.platform.startswith("linux")


def tune_malloc(threshold: int | None = None) -> int | None:
    """Set glibc's mmap threshold (bytes); returns the value in force, or None where it does not apply."""
    global _applied
    if not _tuning_allowed():
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


HUGETLB_TUNABLE = "glibc.malloc.hugetlb=1"


def huge_pages_possible() -> bool:
    """glibc >= 2.35 on Linux with transparent huge pages not switched off, and slimrl's malloc tuning not off."""
    if not _tuning_allowed():
        return False
    libc = _load_libc()
    try:
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        major, minor = (int(x) for x in libc.gnu_get_libc_version().decode().split(".")[:2])
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read()
    except (AttributeError, OSError, ValueError):
        return False
    return (major, minor) >= (2, 35) and "[never]" not in thp


def restart_with_huge_pages() -> None:
    """Replace this process by the same command with ``GLIBC_TUNABLES`` + ``glibc.malloc.hugetlb=1`` (once: a
    process that has it, or where it cannot act, returns at once). Only for a program's entry point, before any
    work: ``os.execve`` keeps the process id, the terminal and the arguments (``sys.orig_argv``)."""
    current = os.environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in current or not huge_pages_possible():
        return
    env = {**os.environ, "GLIBC_TUNABLES": f"{current}:{HUGETLB_TUNABLE}" if current else HUGETLB_TUNABLE}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def cpu_training() -> bool:
    """True when no CUDA device is in use, i.e. the trainer's tensors live in host memory."""
    import torch

    return not torch.cuda.is_available()
