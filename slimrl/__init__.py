"""slimrl: TRL's RL trainers with far less memory and time, same math.

    from slimrl import FastLanguageModel      # patches TRL's trainers, as importing Unsloth does
    from slimrl import PatchFastRL            # the explicit, reversible way (PatchFastRL("grpo"); unpatch())

``FastLanguageModel``, ``FastModel`` and ``FastVisionModel`` are loaded on first use
(:func:`slimrl.patching.patch_on_first_use`). Importing slimrl changes nothing: the patches register, and slimrl's
one-line error display (:mod:`slimrl.compat.runtime.callsite`) is installed, at the first use of ``PatchFastRL``,
``FastLanguageModel`` or the ``slimrl`` command.
"""

from __future__ import annotations

from typing import Any

import slimrl.compat.runtime.bnb_notice  # noqa: F401 - first: drops bitsandbytes' CPU-kernel notice before PEFT imports it
from slimrl.compat.devices import is_bfloat16_supported
from slimrl.compat.versions import Version
from slimrl.environments import is_port_open, launch_openenv
from slimrl.patching import PatchDPOTrainer, PatchFastRL, unpatch
from slimrl.rewards import (
    SandboxLimits,
    check_python_modules,
    create_locked_down_function,
    execute_with_time_limit,
    run_sandboxed,
)
from slimrl.sampling import vLLMSamplingParams
from slimrl.verify import verify  # `slimrl.verify(...)`: the patch proven exact on your setup (slimrl verify)

_ON_FIRST_USE = {name: name for name in ("FastLanguageModel", "FastModel", "FastVisionModel")}


def __getattr__(name: str) -> Any:
    if name in _ON_FIRST_USE:
        import slimrl.models as models
        from slimrl.compat.runtime.callsite import install_one_line_errors
        from slimrl.patching import patch_on_first_use

        install_one_line_errors()  # from the first use of slimrl's entry point, its refusals print as one line
        value = getattr(models, _ON_FIRST_USE[name])
        patch_on_first_use()
        globals()[name] = value
        return value
    raise AttributeError(f"module 'slimrl' has no attribute {name!r}")


__all__ = [
    "FastLanguageModel",
    "FastModel",
    "FastVisionModel",
    "PatchFastRL",
    "PatchDPOTrainer",
    "unpatch",
    "vLLMSamplingParams",
    "is_bfloat16_supported",
    "verify",
    "check_python_modules",
    "create_locked_down_function",
    "execute_with_time_limit",
    "run_sandboxed",
    "SandboxLimits",
    "Version",
    "launch_openenv",
    "is_port_open",
]
__version__ = "0.1.0"
