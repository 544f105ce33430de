"""Offloaded activation checkpointing: the layer inputs a checkpointed decoder layer keeps for its recompute live in
pinned host memory, copied out and back on a side stream so the copies overlap the compute.

Checkpointing (non-reentrant) keeps only each layer's inputs for the backward; at long completions those inputs,
``layers x rows x tokens x hidden`` bytes, are what is left of the activation memory. transformers' own
``activation_checkpointing_enable(offload=True)`` moves them with ``torch.autograd.graph.save_on_cpu``, whose copies
run on the compute stream (the step waits for every copy). Here (:class:`CudaCopies`):

* forward (``pack``): the side stream waits for the compute stream, copies the tensor device -> pinned host
  (``non_blocking``) and the device tensor is marked as used by the side stream (``record_stream``), so its memory
  is reused only once the copy is done; the compute stream does not wait.
* backward (``unpack``): layers are recomputed last-to-first. Unpacking layer k's inputs starts the host -> device
  copy of layer k-1's inputs on the side stream (one layer of look-ahead), so the copy overlaps layer k's recompute
  and backward; the compute stream waits only on the event of the copy it needs, and the fetched tensor is marked as
  used by the compute stream.

**Host memory** (:class:`HostPool`): pinned buffers are slimrl's own, page-locked with ``cudaHostRegister`` at their
exact size (PyTorch's pinned allocator rounds every request up to a power of two and caches the blocks for the life
of the process: tens of GiB at 8B x 8K tokens), kept in a pool and reused from step to step (a buffer goes back to
the pool when autograd drops the saved tensor; every copy into or out of a buffer runs on the side stream, so stream
order keeps a reuse behind the copy that last read it). The pool is bounded: pinned memory beyond
:data:`PINNED_SHARE` of the machine's RAM is never taken (it cannot be swapped, and the kernel's out-of-memory killer
ends the process first, a Colab VM has 12.7 GB); past it, layer inputs go to pageable host memory (slower copies,
one line says so). ``slimrl plan`` counts the pool (``host_pinned_bytes``).

The values are copied bit for bit, so the gradients equal those of plain checkpointing exactly (tests). Tensors
under :data:`MIN_BYTES` (masks, rotary tables, the checkpoint's dummy) and parameters stay where they are. On a CPU
the same bookkeeping runs with plain copies (:class:`HostCopies`), so the logic is tested there.

How it is installed: :func:`slimrl.models.checkpointing.install_policy` wraps the model's checkpoint function with
:func:`offloaded` at every (re-)enable, the Trainer's own at ``train()`` included.
"""

from __future__ import annotations

import functools
import weakref
from contextlib import nullcontext
from typing import Any

import torch

from slimrl.compat.memory import total_bytes
from slimrl.compat.runtime.callsite import warn

MIN_BYTES = 1 << 20  # smaller saved tensors are not worth a copy
PINNED_SHARE = 0.4  # of the machine's RAM, at most, page-locked for layer inputs
GRANULE = 2 << 20  # buffer sizes are rounded up to this, so a slightly shorter step reuses last step's buffers


class HostCopies:
    """Copies between a device and host memory with no streams (a CPU: the copies are plain)."""

    def new_buffer(self, nbytes: int, pin: bool) -> tuple[torch.Tensor, bool]:
        return torch.empty(nbytes, dtype=torch.uint8), False

    def free_buffer(self, buf: torch.Tensor, pinned: bool) -> None:
        pass

    def out(self, host: torch.Tensor, t: torch.Tensor) -> None:
        host.copy_(t)

    def back(self, host: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, Any]:
        return host.to(device, copy=True), None

    def use(self, t: torch.Tensor, ready: Any) -> None:
        pass


class CudaCopies(HostCopies):
    """The stream/event protocol of the module docstring, and page-locking of the pool's buffers: registered at
    their size where this machine allows it, else pinned by torch's allocator, else pageable
    (:func:`slimrl.compat.page_lock.probe`)."""

    def __init__(self, device: torch.device) -> None:
        from slimrl.compat.page_lock import probe

        self.stream = torch.cuda.Stream(device)
        self.device = device
        self.lock = probe(device)
        self.lock_error: int | None = None  # cudaHostRegister's error, once it failed: no more tries
        self.registered: set[int] = set()  # data pointers of the buffers this pool registered

    def new_buffer(self, nbytes: int, pin: bool) -> tuple[torch.Tensor, bool]:
        if pin and not self.lock.registers and self.lock.allocates:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), True
        buf = torch.empty(nbytes, dtype=torch.uint8)
        if not pin or self.lock_error is not None or not self.lock.registers:
            return buf, False
        error = int(torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), nbytes, 0))
        if error == 0:
            self.registered.add(buf.data_ptr())
            return buf, True
        self.lock_error = error  # a locked-memory limit reached: said once, not retried per buffer
        warn(
            f"offloaded checkpointing: page-locking host memory failed (cudaHostRegister error {error}); layer "
            f"inputs are copied through pageable memory, which is slower and waits for each copy. "
            f"use_gradient_checkpointing=True keeps them on the GPU instead"
        )
        return buf, False

    def free_buffer(self, buf: torch.Tensor, pinned: bool) -> None:
        if pinned:
            self.stream.synchronize()  # no copy may still read it
            if buf.data_ptr() in self.registered:
                self.registered.discard(buf.data_ptr())
                torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())

    def out(self, host: torch.Tensor, t: torch.Tensor) -> None:
        self.stream.wait_stream(torch.cuda.current_stream(t.device))  # t is written by the compute stream
        with torch.cuda.stream(self.stream):
            host.copy_(t, non_blocking=True)
        t.record_stream(self.stream)  # t's memory is not handed out again before the copy has read it

    def back(self, host: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, Any]:
        with torch.cuda.stream(self.stream):
            fetched = host.to(device, non_blocking=True)
            return fetched, self.stream.record_event()

    def use(self, t: torch.Tensor, ready: Any) -> None:
        compute = torch.cuda.current_stream(t.device)
        compute.wait_event(ready)
        t.record_stream(compute)  # allocated on the side stream, used on the compute stream


class HostPool:
    """Host buffers for offloaded tensors, reused across steps, pinned up to ``cap`` bytes (module docstring)."""

    def __init__(self, copies: HostCopies, cap: int) -> None:
        self.copies, self.cap = copies, cap
        self.free: list[tuple[torch.Tensor, bool]] = []
        self.pinned_bytes = 0  # page-locked bytes held (in use or free)
        self.created = 0  # buffers ever made (a test sees the reuse)
        self.warned = False

    def take(self, nbytes: int) -> tuple[torch.Tensor, bool]:
        """A buffer of at least ``nbytes`` (best fit among the free ones, else a new one)."""
        fits = [i for i, (b, _) in enumerate(self.free) if nbytes <= b.numel() <= nbytes + max(GRANULE, nbytes // 4)]
        if fits:
            return self.free.pop(min(fits, key=lambda i: self.free[i][0].numel()))
        size = -(-nbytes // GRANULE) * GRANULE
        while self.pinned_bytes + size > self.cap and any(p for _, p in self.free):
            self._drop(max((e for e in self.free if e[1]), key=lambda e: e[0].numel()))
        pin = self.pinned_bytes + size <= self.cap
        buf, pinned = self.copies.new_buffer(size, pin)
        self.created += 1
        self.pinned_bytes += size if pinned else 0
        if not pin and not self.warned:
            self.warned = True
            warn(
                f"offloaded checkpointing: the layer inputs of this step need more than {self.cap / 2**30:.2f} GiB "
                f"of pinned host memory, the most slimrl page-locks ({PINNED_SHARE:.0%} of this machine's RAM); the "
                f"rest go to pageable memory (slower copies). Shorter completions or fewer rows per device keep "
                f"them pinned; `slimrl plan` counts them"
            )
        return buf, pinned

    def give(self, entry: tuple[torch.Tensor, bool]) -> None:
        self.free.append(entry)

    def _drop(self, entry: tuple[torch.Tensor, bool]) -> None:
        self.free.remove(entry)
        self.copies.free_buffer(*entry)
        self.pinned_bytes -= entry[0].numel() if entry[1] else 0

    def clear(self) -> None:
        for entry in list(self.free):
            self._drop(entry)


class _Handle:
    """One offloaded tensor: its host copy (a view of a pool buffer), where it came from, the device copy once
    fetched, and a weak reference to the handle packed before it (the look-ahead). Only autograd's graph holds a
    handle: when the backward has used it (or the graph is dropped) its buffer goes back to the pool."""

    __slots__ = ("host", "device", "fetched", "ready", "prev", "used", "__weakref__")

    def __init__(self, host: torch.Tensor, device: torch.device, prev: _Handle | None) -> None:
        self.host, self.device = host, device
        self.prev = weakref.ref(prev) if prev is not None else None
        self.fetched: torch.Tensor | None = None
        self.ready: Any = None  # the copy's CUDA event
        self.used = False  # unpacked once: a look-ahead never fetches it again


class Offloader:
    """``saved_tensors_hooks`` pair that keeps large saved tensors in host memory (see the module docstring)."""

    def __init__(self, copies: HostCopies | None = None, cap: int | None = None) -> None:
        self._copies = copies
        self._cap = cap
        self.pool: HostPool | None = None
        self._last: weakref.ref | None = None  # the last handle packed: the next one's look-ahead predecessor
        self.packed = self.fetched_ahead = 0  # counters for tests and benches

    def _pool(self, device: torch.device) -> HostPool:
        if self.pool is None:
            copies = self._copies or (CudaCopies(device) if device.type == "cuda" else HostCopies())
            cap = self._cap if self._cap is not None else int(PINNED_SHARE * total_bytes(torch.device("cpu")))
            self.pool = HostPool(copies, cap)
        return self.pool

    def pack(self, t: torch.Tensor) -> Any:
        if isinstance(t, torch.nn.Parameter) or t.numel() * t.element_size() < MIN_BYTES:
            return t
        pool = self._pool(t.device)
        nbytes = t.numel() * t.element_size()
        entry = pool.take(nbytes)
        host = entry[0][:nbytes].view(t.dtype).view(t.shape)  # [*t.shape], contiguous
        pool.copies.out(host, t)
        self.packed += 1
        handle = _Handle(host, t.device, self._last() if self._last is not None else None)
        weakref.finalize(handle, pool.give, entry)
        self._last = weakref.ref(handle)
        return handle

    def _fetch(self, h: _Handle) -> None:
        """Start the host -> device copy of ``h``."""
        if h.fetched is None:
            h.fetched, h.ready = self.pool.copies.back(h.host, h.device)

    def unpack(self, h: Any) -> torch.Tensor:
        if not isinstance(h, _Handle):
            return h
        self._fetch(h)
        prev = h.prev() if h.prev is not None else None
        if prev is not None and prev.fetched is None and not prev.used:  # look-ahead: the layer recomputed next
            self._fetch(prev)
            self.fetched_ahead += 1
        t, h.fetched, h.used = h.fetched, None, True  # a second unpack (retain_graph) fetches again
        if h.ready is not None:
            self.pool.copies.use(t, h.ready)
        return t

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def offloaded(checkpoint_func: Any, offloader: Offloader) -> Any:
    """``checkpoint_func`` (transformers' per-layer checkpoint call) with the layer inputs it saves offloaded."""

    @functools.wraps(checkpoint_func)
    def checkpoint_offloaded(function: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = offloader.hooks() if torch.is_grad_enabled() else nullcontext()
        with ctx:
            return checkpoint_func(function, *args, **kwargs)

    checkpoint_offloaded.slimrl_offloader = offloader
    return checkpoint_offloaded
