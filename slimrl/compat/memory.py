"""Every memory reading slimrl makes, in one place: free / total / resident bytes, and peak windows.

Peaks: on CUDA, ``torch.cuda.max_memory_allocated`` since the last reset; on the host, the kernel's peak resident
set (``VmHWM``), which writing ``5`` to ``/proc/self/clear_refs`` resets (without that permission the window
starts at process start). Several readers nest (a training step's window around the engine's generation and
training phases), so a reset never loses a peak: :func:`reset_peak` first folds the current peak into every open
:class:`PeakWindow`, whose :meth:`PeakWindow.peak_bytes` is the maximum over its whole lifetime.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_OPEN: list[PeakWindow] = []


def parse_bytes(text: str | int, option: str = "--budget") -> int:
    """``"20GB"``, ``"20 GiB"``, ``"512MB"``, ``"1.5T"``, ``3`` -> bytes (GB = GiB = 2**30, as ``nvidia-smi`` counts);
    a ValueError naming ``option`` otherwise."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
    if not m:
        raise ValueError(f"{option} {text!r}: not a size; write e.g. 20GB or 512MB")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def _proc_kib(path: str, key: str) -> int | None:
    """A ``key:  N kB`` line of a /proc file, in bytes (None where the file or key is missing: not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_bytes(device: torch.device) -> int:
    """Free memory on ``device``: CUDA's free bytes, or the host's available RAM (``MemAvailable``); 0 if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return _proc_kib("/proc/meminfo", "MemAvailable") or 0


def total_bytes(device: torch.device) -> int:
    """The device's memory (CUDA), or the machine's RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    import psutil

    return psutil.virtual_memory().total


def resident_bytes() -> int:
    """This process's resident set size (host memory really in use)."""
    import psutil

    return psutil.Process().memory_info().rss


def _cuda(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_initialized()


def peak_bytes(device: torch.device) -> int:
    """Peak memory in use since the last :func:`reset_peak`: CUDA max allocated, or the host's peak resident set
    (VmHWM)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) if _cuda(device) else 0
    peak = _proc_kib("/proc/self/status", "VmHWM")
    return resident_bytes() if peak is None else peak


def reset_peak(device: torch.device) -> None:
    """Start a new peak window on ``device``, after folding the current peak into every open :class:`PeakWindow`."""
    current = peak_bytes(device)
    for window in _OPEN:
        if window.device.type == device.type:
            window.folded = max(window.folded, current)
    if device.type == "cuda":
        if _cuda(device):
            torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not Linux, or not allowed: the window then starts at process start
        pass


class PeakWindow:
    """The peak memory of ``device`` from the window's start, through any inner :func:`reset_peak`."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.folded = 0

    def peak_bytes(self) -> int:
        return max(self.folded, peak_bytes(self.device))


@contextmanager
def peak_window(device: torch.device | str) -> Iterator[PeakWindow]:
    """``with peak_window(device) as w: ...; w.peak_bytes()`` — resets the peak at entry (folding it into outer
    windows), stays correct through inner resets."""
    window = PeakWindow(torch.device(device))
    reset_peak(window.device)
    _OPEN.append(window)
    try:
        yield window
    finally:
        _OPEN.remove(window)
        for outer in _OPEN:  # an outer window sees this one's peak too
            if outer.device.type == window.device.type:
                outer.folded = max(outer.folded, window.peak_bytes())
