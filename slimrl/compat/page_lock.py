"""Whether this machine page-locks host memory for a GPU, and whether a copy into it runs behind the host's back.

Offloaded checkpointing (:mod:`slimrl.models.offload`) costs no time only when its copies overlap the compute: the
host buffers must be page-locked and a ``non_blocking`` copy must return before it completes. A VM, a container's
locked-memory limit (``ulimit -l``) or a driver can refuse the first, and then every copy goes through pageable
memory, synchronously. :func:`probe` checks once per device, at a trainer's start (a few milliseconds):

1. registration: ``cudaHostRegister`` of a small host buffer (slimrl's pool locks its own buffers this way);
2. else pinned allocation: ``torch.empty(..., pin_memory=True)`` (torch's caching host allocator), the fallback;
3. with either, that a ``non_blocking`` device-to-host copy of :data:`PROBE_BYTES` returns before its event is done.

The answer prices the offload (``slimrl plan``'s ``offload_copies``; pageable copies are synchronous) and decides
whether slimrl's default uses it (:mod:`slimrl.patching.online.lean_default`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PROBE_BYTES = 32 << 20  # long enough (milliseconds at any PCIe speed) that an early return is seen


@dataclass(frozen=True)
class PageLock:
    """What :func:`probe` found: ``register_error`` (None: ``cudaHostRegister`` worked), ``allocates`` (pinned
    allocation worked), ``copies_async`` (a non-blocking copy returned before completing; False when nothing pins)."""

    register_error: int | None
    allocates: bool
    copies_async: bool

    @property
    def registers(self) -> bool:
        return self.register_error is None

    @property
    def overlaps(self) -> bool:
        """Whether offloaded copies can overlap the compute: memory pins and copies into it run asynchronously."""
        return (self.registers or self.allocates) and self.copies_async

    def line(self) -> str:
        """One line for the user where the offload cannot overlap (empty where it can)."""
        if self.overlaps:
            return ""
        if not (self.registers or self.allocates):
            return (
                f"page-locking host memory is refused here (cudaHostRegister error {self.register_error}, pinned "
                f"allocation failed too; a VM or the locked-memory limit, `ulimit -l`): offloaded layer inputs "
                f"would be copied through pageable memory, synchronously"
            )
        return "a non-blocking copy to pinned host memory waited for completion here: offloaded copies do not overlap"


_FOUND: dict[int, PageLock] = {}


def probe(device: torch.device) -> PageLock:
    """:class:`PageLock` of ``device`` (a CUDA device), measured once per process and device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _FOUND:
        _FOUND[index] = _measure(torch.device("cuda", index))
    return _FOUND[index]


def _measure(device: torch.device) -> PageLock:
    host = torch.empty(PROBE_BYTES, dtype=torch.uint8)
    cudart = torch.cuda.cudart()
    error = int(cudart.cudaHostRegister(host.data_ptr(), PROBE_BYTES, 0))
    allocates = False
    if error != 0:
        try:
            host = torch.empty(PROBE_BYTES, dtype=torch.uint8, pin_memory=True)
            allocates = True
        except RuntimeError:
            return PageLock(error, False, False)
    try:
        early = _copy_returns_early(host, device)
    finally:
        if error == 0:
            cudart.cudaHostUnregister(host.data_ptr())
    return PageLock(error or None, allocates, early)


def _copy_returns_early(host: torch.Tensor, device: torch.device) -> bool:
    """Whether ``host.copy_(device tensor, non_blocking=True)`` returns while the copy is still running."""
    source = torch.empty(host.numel(), dtype=torch.uint8, device=device)
    torch.cuda.synchronize(device)
    host.copy_(source, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    early = not done.query()
    torch.cuda.synchronize(device)  # the buffer is not released while the copy reads it
    return early
