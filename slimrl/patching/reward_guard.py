"""Reward functions checked at every call: a failure names the function and the prompt, before TRL averages it.

TRL calls each reward function as ``f(prompts=..., completions=..., completion_ids=..., **dataset_columns)`` and
expects one float (or ``None``: "this function does not score that completion") per completion. A wrong length
surfaces later as a shape error deep inside TRL, an exception carries no hint which reward raised, and a NaN or
inf reward silently poisons the advantages. :func:`guard_reward_funcs` wraps each plain Python reward function
(not reward models, not async functions) so each of these stops the step with a message that says which
function, which completion and what to return instead.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any


class RewardFunctionError(RuntimeError):
    """A reward function raised; the message names it and the first prompt of the batch."""


class RewardOutputError(ValueError):
    """A reward function returned the wrong number of values, or NaN/inf; the message names it."""


def _short(value: Any, limit: int = 160) -> str:
    text = repr(value[-1]["content"] if isinstance(value, list) and value and isinstance(value[-1], dict)
                and "content" in value[-1] else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def guarded_reward(fn):
    """``fn`` with its output checked (length, finiteness) and its exceptions re-raised with context."""
    if getattr(fn, "__slimrl_guarded__", False) or not callable(fn) or inspect.iscoroutinefunction(fn):
        return fn
    name = getattr(fn, "__name__", type(fn).__name__)

    @functools.wraps(fn)
    def slimrl_guarded_reward(*args, **kwargs):
        prompts = kwargs.get("prompts") or []
        completions = kwargs.get("completions")
        try:
            out = fn(*args, **kwargs)
        except Exception as err:
            first = f" (first prompt of the batch: {_short(prompts[0])})" if prompts else ""
            raise RewardFunctionError(f"reward function {name!r} raised {type(err).__name__}: {err}{first}") from err
        if completions is not None:
            n = len(completions)
            got = len(out) if hasattr(out, "__len__") else None
            if got != n:
                shown = got if got is not None else type(out).__name__
                raise RewardOutputError(f"reward function {name!r} returned {shown} values for {n} completions: "
                                        f"return a list with one float (or None) per completion")
        for i, value in enumerate(out):
            if value is not None and not math.isfinite(float(value)):
                where = f" (prompt {_short(prompts[i])})" if i < len(prompts) else ""
                raise RewardOutputError(f"reward function {name!r} returned {float(value)} for completion "
                                        f"{i}{where}: return a finite float, or None to leave that completion "
                                        f"unscored by {name!r}")
        return out

    slimrl_guarded_reward.__slimrl_guarded__ = True
    return slimrl_guarded_reward


def guard_reward_funcs(reward_funcs: Any) -> Any:
    """The same ``reward_funcs`` argument (one or a list) with each plain Python function guarded; reward models
    (``nn.Module``) and model ids (``str``) pass through unchanged."""
    import torch

    def one(f):
        return f if isinstance(f, str | torch.nn.Module) else guarded_reward(f)

    if isinstance(reward_funcs, list | tuple):
        return type(reward_funcs)(one(f) for f in reward_funcs)
    return one(reward_funcs) if reward_funcs is not None else None
