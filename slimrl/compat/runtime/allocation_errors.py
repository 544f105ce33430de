"""Which errors are an allocation failure slimrl may recover from by retrying smaller, and which are failures the
GPU reported after the fact (never retried): one detector for the trainers' recovery and ``slimrl compare``."""

from __future__ import annotations

import torch

_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate")
# reported by the device after the fact (asynchronously): the context may be corrupted, a retry on it unsafe
_DEVICE_REPORTED = (
    "cuda error",
    "cublas_status",
    "cudnn_status",
    "cusolver_status",
    "cufft_",
    "cuda driver error",
    "illegal memory access",
    "device-side assert",
)


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation failure raised where it happened, which a retry on smaller slices can
    recover from: the CUDA caching allocator's ``OutOfMemoryError`` (raised before any kernel runs), ``MemoryError``,
    the CPU allocator's error. Failures CUDA reports from the device (``CUDA error: out of memory``,
    ``CUBLAS_STATUS_ALLOC_FAILED``, ...) are not: see :func:`device_failure`."""
    if isinstance(error, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and device_failure(error) is None and any(m in text for m in _MARKERS)


def ran_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says memory ran out, wherever it was found: :func:`is_out_of_memory`'s (recoverable) or one
    the device reported (``CUDA error: out of memory``, ``CUBLAS_STATUS_ALLOC_FAILED``). What ``slimrl compare``
    records as "did not fit"; only the first kind is ever retried."""
    text = str(error).lower()
    return is_out_of_memory(error) or (
        device_failure(error) is not None and ("out of memory" in text or "alloc_failed" in text)
    )


def device_failure(error: BaseException) -> str | None:
    """The one line to print for an error CUDA reported from the device (asynchronously), else None: slimrl does
    not retry those (the CUDA context may be corrupted)."""
    if isinstance(error, torch.OutOfMemoryError) or not isinstance(error, RuntimeError):
        return None
    text = str(error).strip()
    if not any(m in text.lower() for m in _DEVICE_REPORTED):
        return None
    first = text.splitlines()[0][:200] if text else type(error).__name__
    return (
        f"slimrl: the GPU reported a failure ({first}); no retry on smaller slices, since after an error reported "
        f"by the device the CUDA context may be corrupted. Restart the process; if memory was short, lower "
        f"per_device_train_batch_size, max_completion_length or gpu_memory_utilization"
    )
