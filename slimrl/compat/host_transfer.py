"""A call's small bookkeeping (row lengths, index lists) between host and device with the fewest host syncs.

On CUDA every read of a device value on the host (``.tolist()``, ``.item()``, ``bool(t)``) waits for the stream to
drain, and so does ``torch.tensor(values, device="cuda")``: a copy from pageable memory with ``non_blocking=False``
ends in a stream synchronisation. While the host waits, it queues no kernel, so the GPU idles for the launches that
follow. Here a call that needs several device values reads them in one transfer (:func:`read_together`), and host
lists reach the device staged in pinned memory with ``non_blocking=True`` (:func:`to_device`): the copy is queued and
the host goes on (torch's caching host allocator keeps the staging buffer until the copy has read it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_PINNING: dict[str, bool] = {"refused": False}  # pin_memory() failed once (a locked-memory limit): not retried


def read_together(tensors: Sequence[torch.Tensor]) -> list[list]:
    """Integer or bool tensors of one device (``[B]`` or ``[B, k]``), read to the host in one transfer: per tensor
    its ``tolist()``."""
    flat = torch.cat([t.reshape(-1).long() for t in tensors])  # [sum of numels]
    values = flat.tolist()  # the one host sync
    out, start = [], 0
    for t in tensors:
        part = values[start : start + t.numel()]
        start += t.numel()
        if t.dim() == 2:
            k = t.size(1)
            part = [part[i * k : (i + 1) * k] for i in range(t.size(0))]
        out.append(part)
    return out


def to_device(values: Sequence[int], device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` on ``device`` (see :func:`move`)."""
    return move(torch.tensor(values, dtype=dtype), device)


def move(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: on CUDA queued from pinned memory (no host sync), through pageable memory (a
    sync) where this machine refuses to pin."""
    if device.type != "cuda":
        return host.to(device)
    if not _PINNING["refused"]:
        try:
            return host.pin_memory().to(device, non_blocking=True)
        except RuntimeError:
            _PINNING["refused"] = True
    return host.to(device)
