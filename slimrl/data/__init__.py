"""Built-in demo task."""

from slimrl.data.arithmetic import (
    ANSWER_TAG,
    correctness_reward,
    format_reward,
    make_arithmetic_dataset,
    make_preference_dataset,
)

__all__ = ["ANSWER_TAG", "correctness_reward", "format_reward", "make_arithmetic_dataset", "make_preference_dataset"]
