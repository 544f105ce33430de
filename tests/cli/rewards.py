"""Reward functions the CLI tests pass with --reward tests.cli.rewards:<name>."""

import os
import time

NOT_CALLABLE = 3


def digits(completions, **kwargs):
    """Fraction of digit characters (a signal the tiny model can move)."""
    time.sleep(float(os.environ.get("SLIMRL_TEST_REWARD_SLEEP", "0")))
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def broken(completions, **kwargs):
    """A reward with a bug: it reads a column the dataset does not have."""
    return [kwargs["answer"][i] for i in range(len(completions))]
