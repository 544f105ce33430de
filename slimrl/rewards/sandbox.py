"""Rewards that run code the model wrote: Unsloth's three helpers, with its names and signatures.

Unsloth's code-writing RL notebooks (the gpt-oss 2048 game, the matmul kernels) reward a completion by extracting a
Python function from it and running it. A policy under RL pressure learns to cheat where it can (import a library
that solves the task, read the grader's globals, loop forever), so each reward uses three guards:

* :func:`check_python_modules` — which modules the code imports: ``(ok, info)``, ``ok`` when every import is from
  Python's standard library (no third-party package, no relative import); ``info`` lists ``stdlib``,
  ``non_stdlib`` and ``relative_imports``, plus ``error`` when the code does not parse.
* :func:`create_locked_down_function` — the one function the code defines, rebuilt over empty globals: it sees
  Python's builtins and its own arguments, closures and imports, never the caller's module (no ``np``, no game
  object, no grader).
* :func:`execute_with_time_limit` — a decorator that stops the call after ``seconds`` with ``TimeoutError``: on the
  main thread through ``SIGALRM`` (a pure-Python infinite loop is interrupted; an outer time limit still fires
  first when it is earlier); on other threads the call runs in a helper thread that is sent ``TimeoutError``.

These are guards against a policy's shortcuts, not a security boundary against hostile code: a reward that runs
untrusted code from outside the training loop belongs in a separate process or container.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any


def check_python_modules(code: str) -> tuple[bool, dict[str, Any]]:
    """``(ok, info)``: ``ok`` when ``code`` imports only standard-library modules (module docstring)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        return False, {"error": f"SyntaxError: {err}", "stdlib": [], "non_stdlib": [], "relative_imports": 0}
    imported: set[str] = set()
    relative = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                relative += 1
            elif node.module:
                imported.add(node.module.split(".")[0])
    stdlib = sorted(m for m in imported if m in sys.stdlib_module_names)
    other = sorted(m for m in imported if m not in sys.stdlib_module_names)
    return not other and not relative, {"stdlib": stdlib, "non_stdlib": other, "relative_imports": relative}


def create_locked_down_function(code: str) -> Callable[..., Any]:
    """The single function ``code`` defines, with empty globals (module docstring). ``code`` must consist of one
    top-level ``def`` (imports inside it are fine); anything else is a ``ValueError``/``SyntaxError``."""
    tree = ast.parse(code)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    others = [type(n).__name__ for n in tree.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if len(defs) != 1 or others:
        raise ValueError(f"expected exactly one top-level function definition, found {len(defs)} function(s)"
                         + (f" and other statements ({', '.join(others)})" if others else ""))
    namespace: dict[str, Any] = {"__builtins__": __builtins__}
    exec(compile(tree, "<locked-down function>", "exec"), namespace)  # noqa: S102 - the point of this module
    made = namespace[defs[0].name]
    locked = types.FunctionType(made.__code__, {"__builtins__": __builtins__}, made.__name__, made.__defaults__,
                                made.__closure__)
    locked.__kwdefaults__ = made.__kwdefaults__
    return locked


def execute_with_time_limit(seconds: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the wrapped call raises ``TimeoutError`` once it has run ``seconds`` (module docstring)."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0:
        raise ValueError(f"execute_with_time_limit(seconds={seconds!r}): pass a positive number of seconds")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def limited(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
                return _on_main_thread(fn, seconds, args, kwargs)
            return _on_helper_thread(fn, seconds, args, kwargs)

        return limited

    return decorate


def _on_main_thread(fn: Callable[..., Any], seconds: float, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` under ``SIGALRM``; an earlier outer timer keeps its deadline and its handler."""
    start = time.monotonic()
    deadline = start + seconds
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    outer_deadline = start + outer_left if outer_left > 0 else None

    def on_alarm(signum: int, frame: Any) -> None:
        if time.monotonic() >= deadline - 1e-3:
            raise TimeoutError(f"Timed out after {seconds}s")
        if callable(outer_handler):  # the outer timer's turn
            outer_handler(signum, frame)

    first = min(deadline, outer_deadline) if outer_deadline is not None else deadline
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(first - time.monotonic(), 1e-4))
    try:
        return fn(*args, **kwargs)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_deadline is not None:  # give the outer timer back what it has left
            signal.setitimer(signal.ITIMER_REAL, max(outer_deadline - time.monotonic(), 1e-4), outer_interval)


def _on_helper_thread(fn: Callable[..., Any], seconds: float, args: tuple, kwargs: dict) -> Any:
    """``fn`` in a daemon thread; past ``seconds`` that thread is sent ``TimeoutError`` and so is the caller."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            box["error"] = err

    worker = threading.Thread(target=run, name="slimrl-time-limit", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(worker.ident), ctypes.py_object(TimeoutError))
        raise TimeoutError(f"Timed out after {seconds}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")
