"""Memory for the colocated engine: how big its KV cache is ("auto"), releasing it between phases, phase peaks.

* :func:`kv_cache_bytes` turns ``gpu_memory_utilization`` into the byte count vLLM is given
  (``kv_cache_memory_bytes``). A float keeps vLLM's meaning (fraction of the device for the engine, on CUDA); on CPU
  the same fraction of the machine's available RAM. ``"auto"`` sizes the cache from what is free once the training
  side is placed: free memory - 3 x trainable bytes (gradient + Adam's two moments) - a training reserve
  (a quarter of the rest), and never more than the generation batch can fill
  (``max_num_seqs x max_model_len`` tokens).
* :func:`release_host_pages` is the CPU stand-in for vLLM's sleep level 1 (which vLLM supports on CUDA/ROCm/XPU
  only): the KV cache's pages are handed back to the OS with ``madvise(MADV_DONTNEED)``; the tensors stay
  allocated and read as zeros afterwards (fresh pages are mapped on the next write), so the engine must not reuse
  cached prefixes after a release (:class:`slimrl.generation.engine.SlimrlEngine` resets its prefix cache).
"""

from __future__ import annotations

import ctypes
import mmap
import os

import torch

from slimrl.compat.engine_memory import auto_kv_bytes
from slimrl.compat.memory import free_bytes_as_vllm_measures, total_bytes

_MADV_DONTNEED = 4


def kv_cache_bytes(
    utilization: float | str, device: torch.device, per_token: int, max_tokens: int, trainable_bytes: int
) -> int | None:
    """Bytes for the engine's KV cache (see the module docstring), or None where vLLM takes the fraction itself
    (a float on CUDA)."""
    wanted = per_token * max_tokens
    if utilization == "auto":
        kv = auto_kv_bytes(free_bytes_as_vllm_measures(device), trainable_bytes, per_token, max_tokens)
        if kv is None:
            raise MemoryError(
                "gpu_memory_utilization='auto': too little memory left for the generation KV cache after the model, "
                "the adapter and its optimizer state; free memory, lower max_seq_length, or pass "
                "fast_inference=False"
            )
        return kv
    if not isinstance(utilization, int | float) or not 0 < utilization < 1:
        raise ValueError(f"gpu_memory_utilization must be a float in (0, 1) or 'auto', got {utilization!r}")
    if device.type == "cuda":
        return None
    return min(wanted, int(total_bytes(device) * utilization))


def release_host_pages(tensors: list[torch.Tensor]) -> int:
    """Give the physical pages under ``tensors`` (CPU) back to the OS; returns the bytes released."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    seen: set[int] = set()
    released = 0
    for t in tensors:
        if t is None or t.device.type != "cpu":
            continue
        storage = t.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
        if start in seen or size == 0:
            continue
        seen.add(start)
        lo = (start + page - 1) // page * page  # whole pages inside the storage only
        hi = (start + size) // page * page
        if hi <= lo:
            continue
        if libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
            raise OSError(ctypes.get_errno(), f"madvise failed: {os.strerror(ctypes.get_errno())}")
        released += hi - lo
    return released
