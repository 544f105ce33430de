"""Helpers for reward functions (Unsloth's names): guards for rewards that run code the model wrote."""

from slimrl.rewards.sandbox import check_python_modules, create_locked_down_function, execute_with_time_limit

__all__ = ["check_python_modules", "create_locked_down_function", "execute_with_time_limit"]
