"""How many intra-op threads torch should use on a CPU that other processes may share.

torch starts one thread per core it sees; when another CPU-bound process runs beside it, those threads wait on
each other at every parallel region and a step gets several times slower. :func:`choose_threads` takes the cores
this process may run on (``os.sched_getaffinity``) minus the ones already busy (the 1-minute load average,
rounded), at least one, unless the user decided: ``--threads N`` or ``OMP_NUM_THREADS``.
"""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_threads(requested: int | None = None) -> tuple[int, str]:
    """(threads, why) — ``requested`` (``--threads``) wins, then ``OMP_NUM_THREADS``, then the idle cores."""
    if requested is not None:
        return requested, "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    cores = available_cores()
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):
        busy = 0.0
    threads = max(1, min(cores, cores - round(busy)))
    return threads, f"{cores} cores available, load {busy:.1f}"


def apply_threads(requested: int | None = None) -> str:
    """Set torch's intra-op threads (:func:`choose_threads`); returns the line ``slimrl train`` prints."""
    import torch

    threads, why = choose_threads(requested)
    torch.set_num_threads(threads)
    return f"slimrl train: {threads} compute thread{'s' if threads != 1 else ''} ({why}; --threads N to choose)"
