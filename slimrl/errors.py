"""slimrl's one input-error type: bad input said in one line naming the argument (option, flag or field) and the fix,
raised before any compute. The command line prints it as ``<prog>: error: <line>`` with exit status 2; the Python
API lets it propagate. It imports nothing, so every layer may raise it."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input: one line naming the argument and the fix (a ``ValueError``, as Python's own bad arguments are)."""
