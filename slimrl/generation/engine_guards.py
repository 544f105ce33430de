"""What vLLM's own calls on a slimrl engine must not do to the training model's weights, which the engine shares.

The engine's base weights are the training model's tensors (:mod:`slimrl.generation.shared_loader`), so two vLLM
calls that scripts reach through ``model.vllm_engine.llm`` (Unsloth's notebooks hand vLLM's ``LLM`` out as
``model.vllm_engine``; TRL's colocate sync calls the model's ``load_weights``) would act on the trainer:

* ``llm.sleep(level=1)`` moves the weights vLLM allocated to the host and ``level=2`` discards them: a packed
  ``qkv_proj`` / ``gate_up_proj`` the training model's q/k/v or gate/up are views of would be gone under them. On a
  shared engine a level above 0 releases the KV cache only (slimrl's standby, :meth:`SlimrlEngine.sleep`), with one
  line; level 0 is vLLM's own call, and ``llm.wake_up()`` after it is slimrl's resume.
* ``load_weights`` writes into vLLM's parameters, that is into the trainer's base weights (and vLLM's CPU back end
  has dropped the ``weight_loader`` it needs by then: ``AttributeError``). It is refused in one line naming the
  adapter path, before anything is written.
"""

from __future__ import annotations

import functools
from typing import Any

REFUSAL = (
    "slimrl's engine runs on the training model's own base weights: vLLM's load_weights would write into "
    "them. The engine takes the adapter instead (model.vllm_engine.load_adapter(peft_model), what the "
    "trainers call every step); for TRL's own merge-and-load sync, load the model without fast_inference"
)


def guard(engine: Any, vllm_model: Any) -> None:
    """Install both guards (module docstring) on ``engine``'s started ``vllm.LLM`` and its model."""
    llm = engine.llm
    original_sleep = llm.sleep

    @functools.wraps(original_sleep)
    def sleep(level: int = 1, *args: Any, **kwargs: Any) -> Any:
        if level == 0 or engine.shared_bytes == 0:
            return original_sleep(level, *args, **kwargs)
        return engine.sleep(level)

    llm.sleep = sleep
    original_wake = llm.wake_up
    inside = {"resume": False}  # the engine's own resume calls vLLM's wake_up (CUDA): that call is vLLM's

    @functools.wraps(original_wake)
    def wake_up(*args: Any, **kwargs: Any) -> Any:
        if inside["resume"] or engine.shared_bytes == 0:
            return original_wake(*args, **kwargs)
        if engine.asleep:  # asleep by the guarded sleep (slimrl's standby): slimrl's resume takes it back
            inside["resume"] = True
            try:
                engine.resume()
            finally:
                inside["resume"] = False
        return None

    llm.wake_up = wake_up

    def load_weights(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(REFUSAL)

    vllm_model.load_weights = load_weights
