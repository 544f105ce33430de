"""The ``slimrl`` command's one error type: bad input, said in one line naming the option and the fix."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input: printed as one line naming the argument and the fix."""
