"""Every memory reading slimrl makes, in one place: free / total / resident bytes, and peak windows.

Peaks: on CUDA, ``torch.cuda.max_memory_allocated``; on the host, the kernel's peak resident set (``VmHWM``).
slimrl never resets torch's CUDA peak counters: they are the user's (a notebook prints ``max_memory_reserved()``
after ``train()``, and a reset inside the run would show only the last window). A CUDA window (a training step, an
engine phase) is read from the counters as they move: when the process's peak rose during the window, that peak was
reached inside it and is the window's peak exactly; when it did not, the window's peak lies between what was
allocated at its ends and the earlier peak, and the larger end is reported (a lower bound). On the host the window
starts with writing ``5`` to ``/proc/self/clear_refs`` (which only resets ``VmHWM``; without that permission the
window starts at process start). Several readers nest (a training step's window around the engine's generation and
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


def free_bytes_as_vllm_measures(device: torch.device) -> int:
    """:func:`free_bytes` after what vLLM's GPU worker does before its start-up snapshot (``gc.collect()``, then the
    caching allocator's unused blocks handed back): bytes PyTorch holds reserved but unallocated are free to vLLM,
    so a check on the plain figure would refuse starts vLLM accepts."""
    if device.type == "cuda":
        import gc

        gc.collect()
        torch.cuda.empty_cache()
    return free_bytes(device)


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
    """Peak memory in use: CUDA's max allocated of the process, or the host's peak resident set (VmHWM) since the
    last :func:`reset_peak`."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) if _cuda(device) else 0
    peak = _proc_kib("/proc/self/status", "VmHWM")
    return resident_bytes() if peak is None else peak


def allocated_bytes(device: torch.device) -> int:
    """Bytes allocated now: CUDA's allocated memory, or the host's resident set."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) if _cuda(device) else 0
    return resident_bytes()


def reset_peak(device: torch.device) -> None:
    """Start a new host peak window, after folding the current peak into every open :class:`PeakWindow`; on CUDA
    nothing is reset (the module docstring)."""
    current = peak_bytes(device)
    for window in _OPEN:
        if window.device.type == device.type:
            window.folded = max(window.folded, current)
    if device.type == "cuda":
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
        cuda = self.device.type == "cuda"
        self._process_peak = peak_bytes(self.device) if cuda else None  # the peak before this window (CUDA)
        self._start = allocated_bytes(self.device) if cuda else 0

    def peak_bytes(self) -> int:
        now = peak_bytes(self.device)
        if self._process_peak is not None and now <= self._process_peak:
            now = max(self._start, allocated_bytes(self.device))  # the peak predates the window: a lower bound
        return max(self.folded, now)


@contextmanager
def peak_window(device: torch.device | str) -> Iterator[PeakWindow]:
    """``with peak_window(device) as w: ...; w.peak_bytes()`` — a host window resets the peak at entry (folding it
    into outer windows) and stays correct through inner resets; a CUDA window reads the counters as they move."""
    reset_peak(torch.device(device))
    window = PeakWindow(torch.device(device))
    _OPEN.append(window)
    try:
        yield window
    finally:
        _OPEN.remove(window)
        for outer in _OPEN:  # an outer window sees this one's peak too
            if outer.device.type == window.device.type:
                outer.folded = max(outer.folded, window.peak_bytes())
