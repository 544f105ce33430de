"""Host memory a CUDA run holds: the pinned pool of slimrl's offloaded checkpointing (:mod:`slimrl.models.offload`)."""

from __future__ import annotations

import torch

from slimrl.compat.memory import total_bytes
from slimrl.models.offload import GRANULE, PINNED_SHARE


def pinned_host_bytes(offloaded: int, buffers: int, notes: list[str], host_ram: int | None = None) -> int:
    """The pool's bytes for ``offloaded`` bytes of layer inputs in ``buffers`` buffers (each rounded up to the
    pool's granule); a note when they pass the share of ``host_ram`` (this machine's RAM by default) slimrl
    page-locks, past which they go to pageable memory."""
    if offloaded <= 0 or buffers <= 0:
        return 0
    per = -(-offloaded // buffers // GRANULE) * GRANULE
    held = per * buffers
    ram = host_ram or total_bytes(torch.device("cpu"))
    if held > PINNED_SHARE * ram:
        notes.append(f"offloaded layer inputs: {held / 2**30:.1f} GiB of host memory, more than the "
                     f"{PINNED_SHARE:.0%} of {ram / 2**30:.1f} GiB of RAM slimrl page-locks: the rest are copied "
                     f"through pageable memory (slower); shorter completions or fewer rows keep them pinned")
    return held
