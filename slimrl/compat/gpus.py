"""The GPUs slimrl's users train on, as data, and what each can run: the facts every device decision reads.

A decision that depends on the GPU (the dtype a model loads in, whether bf16 is native, the engine's KV-cache dtype,
its memory arguments, the log-prob chunk size, offloading) is a function of a :class:`Gpu` — the one torch reports
(:func:`current_gpu`) or one of :data:`GPUS` named by the user (``slimrl plan --gpu t4``). Tests present each row
of the table through torch's CUDA API (``tests/fake_gpu.py``) and run the real decisions on it.

``total_bytes`` is the memory torch reports for the card (``get_device_properties().total_memory``, what Unsloth's
notebooks print as "Max memory"; a little under the marketed size). Compute capability decides the dtypes: bf16
arithmetic is native from 8.0 (Ampere); below that torch *emulates* it (``torch.cuda.is_bf16_supported()`` says True
on a T4) and vLLM refuses it, so slimrl counts bf16 as supported only where it is native, as Unsloth does
(``SUPPORTS_BFLOAT16``). fp8 arithmetic is native from 8.9 (Ada, Hopper): the only cards where slimrl asks vLLM for an
fp8 KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

GiB = 2**30
CUDA_CONTEXT_BYTES = int(0.5 * GiB)  # the CUDA context and cuBLAS workspace before any tensor: 0.3-0.6 GiB measured


@dataclass(frozen=True)
class Gpu:
    """One GPU model: its name as ``torch.cuda.get_device_name`` starts, what torch reports of it, its bandwidth."""

    name: str
    key: str  # what --gpu takes (case-insensitive)
    total_bytes: int
    capability: tuple[int, int]
    bandwidth_gbs: int  # memory bandwidth, GB/s
    host_ram_bytes: int | None = None  # the host RAM that usually comes with it where that is fixed (Colab's VM)
    # the datasheet's dense tensor-core rate in its 16-bit dtype (bf16 from compute capability 8.0, else fp16) with
    # fp32 accumulation (what PyTorch's matmuls use), TFLOP/s; 0: not known
    dense_tflops: float = 0.0
    host_link_gbs: float = 0.0  # host <-> GPU, one direction, nominal (PCIe 3.0/4.0/5.0 x16: 16/32/64 GB/s)

    @property
    def bf16(self) -> bool:
        """bf16 arithmetic in hardware (compute capability >= 8.0)."""
        return self.capability >= (8, 0)

    @property
    def fp8(self) -> bool:
        """fp8 arithmetic in hardware (compute capability >= 8.9)."""
        return self.capability >= (8, 9)

    @property
    def dtype(self) -> torch.dtype:
        """The 16-bit dtype a model loads in when none is asked for."""
        return torch.bfloat16 if self.bf16 else torch.float16

    @property
    def kv_cache_dtypes(self) -> tuple[str, ...]:
        """vLLM ``kv_cache_dtype`` values slimrl uses on this card."""
        return ("auto", "fp8") if self.fp8 else ("auto",)


def _gib(x: float) -> int:
    return int(x * GiB)


# datasheets' figures; the A10G (AWS's variant of the A10's chip) has no datasheet of its own: the A10's
GPUS: tuple[Gpu, ...] = (
    Gpu("Tesla T4", "t4", _gib(14.74), (7, 5), 320, host_ram_bytes=_gib(12.67), dense_tflops=65, host_link_gbs=16),
    Gpu("Tesla V100-SXM2-16GB", "v100", _gib(15.77), (7, 0), 900, dense_tflops=125, host_link_gbs=16),
    Gpu("Tesla V100-SXM2-32GB", "v100-32gb", _gib(31.74), (7, 0), 900, dense_tflops=125, host_link_gbs=16),
    Gpu("NVIDIA L4", "l4", _gib(22.17), (8, 9), 300, dense_tflops=121, host_link_gbs=32),
    Gpu("NVIDIA A10G", "a10g", _gib(22.07), (8, 6), 600, dense_tflops=125, host_link_gbs=32),
    Gpu("NVIDIA GeForce RTX 4090", "rtx4090", _gib(23.65), (8, 9), 1008, dense_tflops=165, host_link_gbs=32),
    Gpu("NVIDIA A100-SXM4-40GB", "a100-40gb", _gib(39.56), (8, 0), 1555, dense_tflops=312, host_link_gbs=32),
    Gpu("NVIDIA A100-SXM4-80GB", "a100-80gb", _gib(79.15), (8, 0), 2039, dense_tflops=312, host_link_gbs=32),
    Gpu("NVIDIA H100 80GB HBM3", "h100", _gib(79.19), (9, 0), 3350, dense_tflops=989, host_link_gbs=64),
    Gpu("NVIDIA H200", "h200", _gib(139.8), (9, 0), 4800, dense_tflops=989, host_link_gbs=64),
)
_ALIASES = {"a100": "a100-40gb", "h100-80gb": "h100", "4090": "rtx4090", "v100-16gb": "v100"}


def find_gpu(name: str) -> Gpu:
    """The table's row for ``name`` (its key, case-insensitive; ``a100`` is the 40 GB card); a ValueError naming the
    known ones otherwise."""
    key = str(name).strip().lower().replace("_", "-").replace(" ", "")
    key = _ALIASES.get(key, key)
    for gpu in GPUS:
        if gpu.key == key:
            return gpu
    raise ValueError(f"--gpu {name!r}: not a GPU slimrl knows; pass one of {', '.join(g.key for g in GPUS)}")


def current_gpu(device: int | None = None) -> Gpu | None:
    """The CUDA device torch sees, as a :class:`Gpu` (its own name, capability and memory; the rest from the table's
    row of that name, else a bandwidth of 0), or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device is None else device
    props = torch.cuda.get_device_properties(index)
    name = str(props.name)
    facts = {"name": name, "total_bytes": int(props.total_memory), "capability": (int(props.major), int(props.minor))}
    known = next((g for g in GPUS if name.startswith(g.name) or g.name.startswith(name)), None)
    return replace(known, **facts) if known else Gpu(key=name.lower(), bandwidth_gbs=0, **facts)


def native_bf16() -> bool:
    """Whether the current device does bf16 arithmetic in hardware: a CUDA GPU of compute capability >= 8.0 (or a
    ROCm GPU, all of which do). False on a CPU and on T4/V100 (torch's own check counts emulation there)."""
    if not torch.cuda.is_available():
        return False
    if getattr(torch.version, "hip", None):
        return True
    return current_gpu().bf16


def local_cuda_index() -> int:
    """The CUDA device this process uses: its ``LOCAL_RANK`` under torchrun/accelerate (TRL's colocate mode gives each
    rank its own GPU), else torch's current device."""
    import os

    rank = os.environ.get("LOCAL_RANK", "")
    count = torch.cuda.device_count()
    if rank.isdigit() and count > 0:
        return int(rank) % count
    return torch.cuda.current_device()


def load_device_map() -> dict[str, int] | None:
    """``device_map`` for transformers' ``from_pretrained``: the whole model on this process's GPU, so it is placed
    shard by shard as it loads (host memory holds one shard at a time, and the model is where a notebook's
    ``inputs.to("cuda")`` expects it before any Trainer moves it); None without CUDA (transformers' default)."""
    if not torch.cuda.is_available():
        return None
    return {"": local_cuda_index()}
