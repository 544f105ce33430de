"""What slimrl gives vLLM's engine on a GPU, and vLLM's start-up check on it: a function of the GPU's numbers.

vLLM's GPU worker refuses to start unless the memory free at that moment covers its budget: ``request_memory``
(``vllm/v1/worker/utils.py``) asks ``free >= gpu_memory_utilization x total - external``, where ``external`` is the
weights a model loader reports as held outside the engine. slimrl's engine starts beside the training model, whose
weights it uses (:mod:`slimrl.generation.shared_loader` reports them as external), so:

* a float ``gpu_memory_utilization`` keeps Unsloth's meaning, the engine's share of the card with its weights
  included, and is passed as it is (vLLM sizes the KV cache from it);
* ``"auto"`` sizes the KV cache from what is free (:func:`slimrl.generation.memory.kv_cache_bytes`) and passes the
  utilization that budget is of the card: ``(external + KV + ENGINE_RESERVE) / total``.

:func:`startup_problem` runs vLLM's own ``request_memory`` on those numbers where vLLM is installed (its rule, stated
above, where it is not: ``slimrl plan`` on a machine without vLLM), so a run that would stop inside vLLM is one line
before any weight loads instead.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from types import SimpleNamespace

GiB = 2**30
ENGINE_RESERVE = GiB // 2  # the engine's own activations beyond its KV cache (profile run, sampler, LoRA buffers)
MAX_NUM_SEQS = 64  # sequences the engine runs at once (its KV cache never needs more than this many full rows)
TRAINING_RESERVE = 0.25  # of what is free after the adapter's state: kept for training when the KV cache is "auto"


@dataclass(frozen=True)
class EngineStart:
    """The engine's memory arguments and the GPU's state when it starts."""

    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None  # None: vLLM sizes the KV cache from the utilization
    free_bytes_at_start: int
    total_bytes: int
    external_weight_bytes: int  # the training model's weights the engine uses in place

    def to_json(self) -> dict:
        return asdict(self)


def cuda_engine_start(
    utilization: float | str, free: int, total: int, external: int, kv_bytes: int | None = None
) -> EngineStart:
    """The arguments for ``utilization`` (a float, or ``"auto"`` with the KV cache's ``kv_bytes`` already sized)
    on a GPU of ``total`` bytes with ``free`` bytes free and ``external`` bytes of shared weights (module
    docstring)."""
    if utilization == "auto":
        if kv_bytes is None:
            raise ValueError("gpu_memory_utilization='auto' needs the KV cache's size")
        share = min(0.99, math.ceil((external + kv_bytes + ENGINE_RESERVE) / total * 1e4) / 1e4)
        return EngineStart(share, int(kv_bytes), int(free), int(total), int(external))
    return EngineStart(float(utilization), None, int(free), int(total), int(external))


def auto_kv_bytes(free: int, trainable: int, per_token: int, max_tokens: int) -> int | None:
    """``gpu_memory_utilization="auto"``'s KV cache: what is free less 3 x the trainable bytes (gradient and AdamW's
    two moments) less a quarter kept for training, never more than the generation batch fills (``max_tokens``);
    None when less than 16 tokens' worth would be left."""
    room = int((free - 3 * trainable) * (1 - TRAINING_RESERVE))
    if room < per_token * 16:
        return None
    return min(per_token * max_tokens, room)


def startup_problem(start: EngineStart) -> str | None:
    """vLLM's start-up check (``request_memory``) on ``start``: None when the engine may start, else its reason."""
    try:
        from vllm.v1.worker.utils import request_memory
    except ImportError:
        request_memory = None
    snapshot = SimpleNamespace(total_memory=start.total_bytes, free_memory=start.free_bytes_at_start, device_="cuda")
    cache = SimpleNamespace(gpu_memory_utilization=start.gpu_memory_utilization)
    if request_memory is not None:
        try:
            request_memory(snapshot, cache, start.external_weight_bytes)
        except ValueError as err:
            return str(err).strip().splitlines()[0]
        return None
    budget = math.ceil(start.total_bytes * start.gpu_memory_utilization) - start.external_weight_bytes
    if start.external_weight_bytes and budget <= 0:
        return "the training model's weights exceed the engine's share of the GPU"
    if start.free_bytes_at_start < budget:
        return f"free memory {start.free_bytes_at_start / GiB:.2f} GiB < the engine's budget {budget / GiB:.2f} GiB"
    return None


def fix_for(start: EngineStart) -> str:
    """What to change when :func:`startup_problem` says no (one sentence)."""
    room = start.free_bytes_at_start + start.external_weight_bytes
    if start.free_bytes_at_start < 0:
        return (
            f"the model's weights alone ({start.external_weight_bytes / GiB:.1f} GiB) leave this GPU no room: "
            f"load_in_4bit=True, a smaller model or a larger GPU (gpu_memory_utilization cannot help)"
        )
    if start.external_weight_bytes >= start.gpu_memory_utilization * start.total_bytes:
        low = math.ceil((start.external_weight_bytes + ENGINE_RESERVE) / start.total_bytes * 100) / 100
        return f"raise gpu_memory_utilization to at least {low:.2f} (the engine's share holds its weights)"
    high = math.floor(room / start.total_bytes * 100) / 100
    return (
        f"lower gpu_memory_utilization to {high:.2f} or below, or pass gpu_memory_utilization='auto', "
        f"load_in_4bit=True or a smaller max_seq_length"
    )
