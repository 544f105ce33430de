"""Peak-memory readings shared by the trainer patches."""

from __future__ import annotations

import resource

import torch


def reset_peak_memory() -> None:
    """Start a new peak window on CUDA (CPU peak RSS cannot be reset without side effects: it stays process-wide)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def peak_memory_mb() -> float:
    """Peak CUDA memory allocated since :func:`reset_peak_memory`, or the process's peak RSS on CPU, in MiB."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
