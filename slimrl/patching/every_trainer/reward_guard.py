"""Reward functions checked at every call: a failure names the function and the prompt, before TRL averages it.

TRL calls each reward function as ``f(prompts=..., completions=..., completion_ids=..., **dataset_columns)`` and
expects one float (or ``None``: "this function does not score that completion") per completion. A wrong length
surfaces later as a shape error deep inside TRL, an exception carries no hint which reward raised, and a NaN or
inf reward silently poisons the advantages. :func:`guard_reward_funcs` wraps each plain Python reward function
(not reward models, not async functions) so each of these stops the step with a message that says which
function, which completion and what to return instead. A function written without ``**kwargs`` (``def
reward(completions, prompts)``) stops TRL alone with a TypeError on the arguments it does not name; guarded, it is
given exactly the arguments it names, and one that requires an argument TRL never passes is refused at trainer
start, naming what TRL passes.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
from typing import Any


class RewardFunctionError(RuntimeError):
    """A reward function raised; the message names it and the first prompt of the batch."""


class RewardOutputError(ValueError):
    """A reward function returned the wrong number of values, or NaN/inf; the message names it."""


def _short(value: Any, limit: int = 160) -> str:
    text = repr(
        value[-1]["content"]
        if isinstance(value, list) and value and isinstance(value[-1], dict) and "content" in value[-1]
        else value
    )
    return text if len(text) <= limit else text[: limit - 3] + "..."


# What TRL passes every reward function besides the dataset's columns (GRPOTrainer._calculate_rewards; "prompt",
# "completion" and "completion_ids" columns are not passed as columns).
TRL_PASSES = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")
NOT_COLUMNS = ("prompt", "completion", "completion_ids")


def named_arguments(fn) -> tuple[str, ...] | None:
    """The keyword names ``fn`` takes when it has no ``**kwargs`` (None when it has, or its signature is unknown)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return tuple(
        p.name for p in params if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )


def _required(fn) -> tuple[str, ...]:
    return tuple(
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )


def check_reward_signature(fn, columns: list[str] | None) -> tuple[str, ...] | None:
    """Before training: a function without ``**kwargs`` that requires an argument TRL never passes is an error
    naming it and what TRL passes; returns the names it takes (None: it takes ``**kwargs``)."""
    names = named_arguments(fn)
    if names is None or columns is None:
        return names
    provided = set(TRL_PASSES) | {c for c in columns if c not in NOT_COLUMNS}
    missing = [n for n in _required(fn) if n not in provided]
    if missing:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise TypeError(
            f"reward function {name!r} requires {', '.join(map(repr, missing))}, which TRL does not "
            f"pass: it passes {', '.join(TRL_PASSES)} and the dataset's columns "
            f"({', '.join(c for c in columns if c not in NOT_COLUMNS) or 'none besides prompt'}); "
            f"rename the parameter or give it a default"
        )
    return names


def guarded_reward(fn, columns: list[str] | None = None):
    """``fn`` with its output checked (length, finiteness) and its exceptions re-raised with context; a function
    without ``**kwargs`` gets only the keyword arguments it names (one line per function: TRL alone would pass it
    every argument and stop with a TypeError)."""
    if getattr(fn, "__slimrl_guarded__", False) or not callable(fn) or inspect.iscoroutinefunction(fn):
        return fn
    name = getattr(fn, "__name__", type(fn).__name__)
    takes = check_reward_signature(fn, columns)
    required = _required(fn) if takes is not None else ()  # read once here, not at every reward call
    if takes is not None:
        print(
            f"slimrl: reward function {name!r} has no **kwargs: it is given only the arguments it names "
            f"({', '.join(takes) or 'none'})",
            file=sys.stderr,
            flush=True,
        )

    @functools.wraps(fn)
    def slimrl_guarded_reward(*args, **kwargs):
        prompts = kwargs.get("prompts") or []
        completions = kwargs.get("completions")
        if takes is not None:
            absent = [n for n in required[len(args) :] if n not in kwargs]
            if absent:
                raise RewardFunctionError(
                    f"reward function {name!r} requires {', '.join(map(repr, absent))}, "
                    f"which TRL did not pass (it passed {', '.join(sorted(kwargs))})"
                )
            kwargs = {k: v for k, v in kwargs.items() if k in takes}
        try:
            out = fn(*args, **kwargs)
        except TypeError as err:  # maybe a reward written for text completions, given chat messages
            texts = _as_text(kwargs.get("completions"))
            if texts is None:
                first = f" (first prompt of the batch: {_short(prompts[0])})" if prompts else ""
                raise RewardFunctionError(f"reward function {name!r} raised TypeError: {err}{first}") from err
            out = _text_call(fn, name, args, {**kwargs, "completions": texts}, prompts)
        except Exception as err:
            first = f" (first prompt of the batch: {_short(prompts[0])})" if prompts else ""
            raise RewardFunctionError(f"reward function {name!r} raised {type(err).__name__}: {err}{first}") from err
        if completions is not None:
            n = len(completions)
            got = len(out) if hasattr(out, "__len__") else None
            if got != n:
                shown = got if got is not None else type(out).__name__
                raise RewardOutputError(
                    f"reward function {name!r} returned {shown} values for {n} completions: "
                    f"return a list with one float (or None) per completion"
                )
        for i, value in enumerate(out):
            if value is not None and not math.isfinite(float(value)):
                where = f" (prompt {_short(prompts[i])})" if i < len(prompts) else ""
                raise RewardOutputError(
                    f"reward function {name!r} returned {float(value)} for completion "
                    f"{i}{where}: return a finite float, or None to leave that completion "
                    f"unscored by {name!r}"
                )
        return out

    slimrl_guarded_reward.__slimrl_guarded__ = True
    return slimrl_guarded_reward


def _as_text(completions: Any) -> list[str] | None:
    """Conversational completions (each a list of messages) as the text of each one's last message; None when they
    are not that."""
    if not isinstance(completions, list) or not completions:
        return None
    texts = []
    for c in completions:
        if not (isinstance(c, list) and c and isinstance(c[-1], dict) and isinstance(c[-1].get("content"), str)):
            return None
        texts.append(c[-1]["content"])
    return texts


_TEXT_NOTED: set[str] = set()


def _text_call(fn, name: str, args: tuple, kwargs: dict, prompts: list) -> Any:
    """``fn`` on text completions, after it raised TypeError on chat messages: a reward written for TRL before 0.24,
    when a notebook's chat-templated prompts made every completion text (TRL alone stops here)."""
    try:
        out = fn(*args, **kwargs)
    except Exception as err:
        first = f" (first prompt of the batch: {_short(prompts[0])})" if prompts else ""
        raise RewardFunctionError(f"reward function {name!r} raised {type(err).__name__}: {err}{first}") from err
    if name not in _TEXT_NOTED:
        _TEXT_NOTED.add(name)
        print(
            f"slimrl: reward function {name!r} takes text completions: it is given each completion's text (the "
            f"assistant message), as TRL gave it for chat-templated prompts before 0.24",
            file=sys.stderr,
            flush=True,
        )
    return out


def guard_reward_funcs(reward_funcs: Any, train_dataset: Any = None) -> Any:
    """The same ``reward_funcs`` argument (one or a list) with each plain Python function guarded; reward models
    (``nn.Module``) and model ids (``str``) pass through unchanged. ``train_dataset``'s columns (when it has them)
    are what TRL passes besides :data:`TRL_PASSES`."""
    import torch

    columns = getattr(train_dataset, "column_names", None)
    columns = list(columns) if isinstance(columns, list | tuple) else None

    def one(f):
        return f if isinstance(f, str | torch.nn.Module) else guarded_reward(f, columns)

    if isinstance(reward_funcs, list | tuple):
        return type(reward_funcs)(one(f) for f in reward_funcs)
    return one(reward_funcs) if reward_funcs is not None else None
