"""``slimrl plan --gpu NAME``: what a run would meet on a GPU of slimrl's table (slimrl/compat/gpus.py) before the
user pays for one: the dtype the model loads in there, and with ``--fast_inference`` whether vLLM's start-up check
passes beside the model, with the engine's arguments and what the card holds (the base weights once: the engine
uses the training model's, :mod:`slimrl.generation.shared_loader`)."""

from __future__ import annotations

from typing import Any

from slimrl.compat.engine_memory import fix_for
from slimrl.compat.gpus import Gpu, find_gpu
from slimrl.models.engine_setup import start_on_gpu


def cuda_total(key: str | None) -> int | None:
    """The planned GPU's memory: the named one's (a key of the table), else this machine's; None without one."""
    if key:
        return find_gpu(key).total_bytes
    import torch

    from slimrl.compat.memory import total_bytes

    return total_bytes(torch.device("cuda")) if torch.cuda.is_available() else None


def gpu_section(
    config: Any,
    gpu: Gpu,
    fast_inference: bool,
    load_in_4bit: bool,
    lora_r: int,
    utilization: float | str,
    max_seq_length: int,
) -> dict[str, Any]:
    """The plan's keys for ``gpu``: ``gpu``, ``compute_capability``, ``dtype``, ``vllm_startup_check`` ("passes",
    "fails" or "no engine") and, with an engine, ``engine`` (its arguments, the free memory at its start, the card's
    total, the base weights on the card) and ``problem`` (vLLM's reason and what to change) when it fails."""
    section: dict[str, Any] = {
        "gpu": gpu.name,
        "compute_capability": ".".join(map(str, gpu.capability)),
        "dtype": str(gpu.dtype).removeprefix("torch."),
        "vllm_startup_check": "no engine",
    }
    if not fast_inference:
        return section
    start, problem, weights = start_on_gpu(gpu, config, utilization, max_seq_length, load_in_4bit, max(lora_r, 1))
    section["vllm_startup_check"] = "fails" if problem else "passes"
    section["engine"] = {**start.to_json(), "base_weight_bytes_on_gpu": weights}
    if problem:
        section["problem"] = f"{problem}; {fix_for(start)}"
    return section


def format_section(section: dict[str, Any]) -> str:
    """The text lines ``slimrl plan`` prints for the section."""
    lines = [
        f"  GPU {section['gpu']} (compute capability {section['compute_capability']}): the model loads in "
        f"{section['dtype']}" + (" (bf16 is only emulated there)" if section["dtype"] == "float16" else "")
    ]
    engine = section.get("engine")
    if engine:
        lines.append(
            f"  vLLM start-up check: {section['vllm_startup_check']} (gpu_memory_utilization "
            f"{engine['gpu_memory_utilization']:.2f} of {engine['total_bytes'] / 2**30:.2f} GiB; free at the "
            f"engine's start {engine['free_bytes_at_start'] / 2**30:.2f} GiB; base weights on the GPU, once: "
            f"{engine['base_weight_bytes_on_gpu'] / 2**30:.2f} GiB)"
        )
    if "problem" in section:
        lines.append(f"  {section['problem']}")
    return "\n".join(lines)
