"""Helpers for reward functions that run code the model wrote: the process sandbox
(:mod:`~slimrl.rewards.process_sandbox`: ``run_sandboxed``, a separate closed-in process, a value or a typed failure)
and Unsloth's in-process guards under Unsloth's names (:mod:`~slimrl.rewards.sandbox`)."""

from slimrl.rewards.process_sandbox import Limits as SandboxLimits
from slimrl.rewards.process_sandbox import SandboxError, SandboxResult, run_sandboxed
from slimrl.rewards.sandbox import check_python_modules, create_locked_down_function, execute_with_time_limit

__all__ = [
    "check_python_modules",
    "create_locked_down_function",
    "execute_with_time_limit",
    "run_sandboxed",
    "SandboxLimits",
    "SandboxResult",
    "SandboxError",
]
