"""Offloaded activation checkpointing: the layer inputs a checkpointed decoder layer keeps for its recompute live in
pinned host memory, copied out and back on a side stream so the copies overlap the compute.

Checkpointing (non-reentrant) keeps only each layer's inputs for the backward; at long completions those inputs,
``layers x rows x tokens x hidden`` bytes, are what is left of the activation memory. transformers' own
``activation_checkpointing_enable(offload=True)`` moves them with ``torch.autograd.graph.save_on_cpu``, whose copies
run on the compute stream (the step waits for every copy). Here:

* forward (``pack``): the side stream waits for the compute stream, copies the tensor device -> pinned host
  (``non_blocking``) and the device tensor is marked as used by the side stream (``record_stream``), so its memory
  is reused only once the copy is done; the compute stream does not wait.
* backward (``unpack``): layers are recomputed last-to-first. Unpacking layer k's inputs starts the host -> device
  copy of layer k-1's inputs on the side stream (one layer of look-ahead), so the copy overlaps layer k's recompute
  and backward; the compute stream waits only on the event of the copy it needs.

The values are copied bit for bit, so the gradients equal those of plain checkpointing exactly (tests). Tensors
under :data:`MIN_BYTES` (masks, rotary tables, the checkpoint's dummy) and parameters stay where they are.

How it is installed: :func:`slimrl.models.checkpointing.install_policy` wraps the model's checkpoint function with
:func:`offloaded` at every (re-)enable, the Trainer's own at ``train()`` included.
"""

from __future__ import annotations

import functools
import weakref
from contextlib import nullcontext
from typing import Any

import torch

MIN_BYTES = 1 << 20  # smaller saved tensors are not worth a copy


class _Handle:
    """One offloaded tensor: its host copy, where it came from, the device copy once fetched, and a weak reference
    to the handle packed before it (the look-ahead). Only autograd's graph holds a handle: when the backward has
    used it (or the graph is dropped) its host copy is freed."""

    __slots__ = ("host", "device", "fetched", "ready", "prev", "__weakref__")

    def __init__(self, host: torch.Tensor, device: torch.device, prev: _Handle | None) -> None:
        self.host, self.device = host, device
        self.prev = weakref.ref(prev) if prev is not None else None
        self.fetched: torch.Tensor | None = None
        self.ready: Any = None  # CUDA event the fetch recorded


class Offloader:
    """``saved_tensors_hooks`` pair that keeps large saved tensors in host memory (see the module docstring).

    On a CUDA device the copies run on ``stream`` (a side stream) into pinned memory. On any other device the same
    bookkeeping runs with synchronous copies (nothing to gain there; that path exists so the logic is tested on CPU).
    """

    def __init__(self) -> None:
        self.stream: Any = None
        self._last: weakref.ref | None = None  # the last handle packed: the next one's look-ahead predecessor
        self.packed = self.fetched_ahead = 0  # counters for tests and benches

    def _side_stream(self, device: torch.device) -> Any:
        if self.stream is None:
            self.stream = torch.cuda.Stream(device)
        return self.stream

    def pack(self, t: torch.Tensor) -> Any:
        if isinstance(t, torch.nn.Parameter) or t.numel() * t.element_size() < MIN_BYTES:
            return t
        on_cuda = t.device.type == "cuda"
        host = torch.empty(t.shape, dtype=t.dtype, layout=t.layout, pin_memory=on_cuda)  # contiguous [*t.shape]
        if on_cuda:
            stream = self._side_stream(t.device)
            stream.wait_stream(torch.cuda.current_stream(t.device))  # t is written by the compute stream
            with torch.cuda.stream(stream):
                host.copy_(t, non_blocking=True)
            t.record_stream(stream)  # t's memory is not handed out again before the copy has read it
        else:
            host.copy_(t)
        self.packed += 1
        handle = _Handle(host, t.device, self._last() if self._last is not None else None)
        self._last = weakref.ref(handle)
        return handle

    def _fetch(self, h: _Handle) -> None:
        """Start the host -> device copy of ``h`` (on the side stream on CUDA)."""
        if h.fetched is not None:
            return
        if h.device.type == "cuda":
            stream = self._side_stream(h.device)
            with torch.cuda.stream(stream):
                h.fetched = h.host.to(h.device, non_blocking=True)
                h.ready = stream.record_event()
        else:
            h.fetched = h.host.to(h.device, copy=True)

    def unpack(self, h: Any) -> torch.Tensor:
        if not isinstance(h, _Handle):
            return h
        self._fetch(h)
        prev = h.prev() if h.prev is not None else None
        if prev is not None and prev.fetched is None:  # look-ahead: the layer recomputed next
            self._fetch(prev)
            self.fetched_ahead += 1
        t, h.fetched = h.fetched, None  # a second unpack (retain_graph) fetches again from the host copy
        if h.ready is not None:
            compute = torch.cuda.current_stream(h.device)
            compute.wait_event(h.ready)
            t.record_stream(compute)  # allocated on the side stream, used on the compute stream
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
