"""A GPU from slimrl's table (slimrl/compat/gpus.py) presented through torch's CUDA API, on a machine without one.

``present(monkeypatch, "t4")`` makes ``torch.cuda`` answer as that card would: available, one device, its name,
compute capability, properties and memory; ``mem_get_info`` gives ``total - context - what was placed`` (the test
places bytes with :meth:`FakeGpu.place`, as a model load or the engine would, and frees them with
:meth:`FakeGpu.release`, optionally kept reserved by the caching allocator until ``torch.cuda.empty_cache()``); the
allocator's counters (``memory_allocated``, ``max_memory_allocated``, ``memory_reserved``) follow the same ledger.
torch's own ``is_bf16_supported`` runs unchanged on these answers, emulation counted as torch counts it (a bf16
tensor can be made on any CUDA device), and transformers' cached view of it is cleared before and after. Tensors stay
on the CPU or the meta device: only what slimrl *decides* is under test, never a CUDA kernel.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from slimrl.compat.gpus import CUDA_CONTEXT_BYTES, Gpu, find_gpu


class FakeGpu:
    """The ledger of one presented GPU (see the module docstring)."""

    def __init__(self, gpu: Gpu) -> None:
        self.gpu = gpu
        self.placed = 0
        self.cached = 0  # reserved by the caching allocator, not allocated: free again after empty_cache()
        self.peak = 0
        self.resets = 0  # calls to torch.cuda.reset_peak_memory_stats

    def place(self, nbytes: int) -> None:
        self.placed += int(nbytes)
        self.peak = max(self.peak, self.placed)

    def release(self, nbytes: int, keep_cached: bool = False) -> None:
        """Free ``nbytes`` placed; ``keep_cached``: the caching allocator keeps them reserved (not free to another
        allocator until ``torch.cuda.empty_cache()``)."""
        nbytes = min(int(nbytes), self.placed)
        self.placed -= nbytes
        self.cached += nbytes if keep_cached else 0

    def empty_cache(self) -> None:
        self.cached = 0

    @property
    def free_bytes(self) -> int:
        return self.gpu.total_bytes - CUDA_CONTEXT_BYTES - self.placed - self.cached

    def properties(self) -> SimpleNamespace:
        major, minor = self.gpu.capability
        return SimpleNamespace(
            name=self.gpu.name,
            major=major,
            minor=minor,
            total_memory=self.gpu.total_bytes,
            multi_processor_count=40,
            is_integrated=False,
        )

    def _reset(self, *_a, **_k) -> None:
        self.resets += 1
        self.peak = self.placed


def clear_transformers_cache() -> None:
    from transformers.utils import import_utils

    for name in ("is_torch_bf16_gpu_available", "is_torch_fp16_available_on_device"):
        fn = getattr(import_utils, name, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


def present(monkeypatch, name: str) -> FakeGpu:
    """Present the table's GPU ``name`` through ``torch.cuda`` for the rest of the test."""
    fake = FakeGpu(find_gpu(name))
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "get_device_name", lambda *_a: fake.gpu.name)
    monkeypatch.setattr(cuda, "get_device_capability", lambda *_a: fake.gpu.capability)
    monkeypatch.setattr(cuda, "get_device_properties", lambda *_a: fake.properties())
    monkeypatch.setattr(cuda, "mem_get_info", lambda *_a: (fake.free_bytes, fake.gpu.total_bytes))
    monkeypatch.setattr(cuda, "memory_allocated", lambda *_a: fake.placed)
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda *_a: fake.peak)
    monkeypatch.setattr(cuda, "memory_reserved", lambda *_a: fake.placed + fake.cached)
    monkeypatch.setattr(cuda, "empty_cache", fake.empty_cache)
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", fake._reset)
    # torch's emulation probe makes a bf16 tensor on the device, which any CUDA device allows
    monkeypatch.setattr(cuda, "_check_bf16_tensor_supported", lambda *_a: True)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.version, "hip", None)
    clear_transformers_cache()
    return fake
