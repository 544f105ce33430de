"""Fast generation for RL: a colocated vLLM engine fed the live LoRA adapter as tensors (``fast_inference=True``).

* :mod:`slimrl.generation.engine` — :class:`SlimrlEngine` (start, adapter as tensors, standby, shared weights)
* :mod:`slimrl.generation.trl_backend` — what TRL's GRPO/RLOO trainers call instead of their ``VLLMGeneration``
* :mod:`slimrl.generation.weights` — adapter tensors out of PEFT, base weights shared with the engine
* :mod:`slimrl.generation.memory` — KV-cache sizing (``"auto"``), page release on CPU, phase peaks
"""

from slimrl.compat.vllm_info import vllm_status
from slimrl.generation.engine import SlimrlEngine

__all__ = ["SlimrlEngine", "vllm_status"]
