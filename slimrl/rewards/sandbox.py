"""Rewards that run code the model wrote: Unsloth's three helpers, with its names and signatures.

Unsloth's code-writing RL notebooks (the gpt-oss 2048 game, the matmul kernels) reward a completion by extracting a
Python function from it and running it. A policy under RL pressure learns to cheat where it can (import a library
that solves the task, read the grader's globals, loop forever), so each reward uses three guards:

* :func:`check_python_modules` — which modules the code imports: ``(ok, info)``, ``ok`` when every import is from
  Python's standard library (no third-party package, no relative import); ``info`` lists ``stdlib``,
  ``non_stdlib`` and ``relative_imports``, plus ``error`` when the code does not parse.
* :func:`create_locked_down_function` — the one function the code defines, run in the reward sandbox
  (:mod:`~slimrl.rewards.session`: its own process under the kernel isolation of
  :func:`~slimrl.rewards.process_sandbox.run_sandboxed`, kept loaded between calls): it sees Python's builtins, the
  standard library and its own arguments (JSON data: lists, dicts, numbers, strings), never the caller's module (no
  ``np``, no game object, no grader), no file of the machine, no process, no network. Its value comes back as data;
  its exception is raised in the caller as a :class:`~slimrl.rewards.sandbox_types.SandboxError` subclass.
* :func:`execute_with_time_limit` — a decorator that stops the call after ``seconds`` with ``TimeoutError``: on the
  main thread through ``SIGALRM`` (a pure-Python infinite loop is interrupted; an outer time limit still fires
  first when it is earlier); on other threads the call runs in a helper thread that is sent ``TimeoutError``. A
  locked-down function called inside gets the time left as its own deadline and its process is ended when it is
  over, so a loop in C code cannot outlast the limit and the code cannot catch it.
"""

from __future__ import annotations

import ast
import ctypes
import functools
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from slimrl.rewards.module_check import check_python_modules

__all__ = ["check_python_modules", "create_locked_down_function", "execute_with_time_limit", "LockedDownFunction"]

_deadline = threading.local()  # the innermost execute_with_time_limit's end, per thread (time.monotonic())


class LockedDownFunction:
    """What :func:`create_locked_down_function` returns: calling it runs the function in the reward sandbox."""

    def __init__(self, code: str, name: str) -> None:
        from slimrl.rewards.session import SandboxSession

        self.__name__ = self.__qualname__ = name
        self._session = SandboxSession(code, name, allow=sys.stdlib_module_names)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        left = getattr(_deadline, "at", None)
        timeout = None if left is None else max(left - time.monotonic(), 1e-3)
        try:
            result = self._session.call(args, kwargs, timeout=timeout)
        except BaseException:
            self._session.close()  # interrupted (the caller's own time limit): the process must not run on
            raise
        if result.failure is not None:
            raise _as_raised(result.failure)
        return result.value

    def close(self) -> None:
        """End the function's process now (it ends with the object otherwise)."""
        self._session.close()

    def __repr__(self) -> str:
        return f"<locked-down function {self.__name__} (reward sandbox)>"


def _as_raised(failure: Exception) -> Exception:
    """The function's own exception as the caller would have seen it in process: the built-in exception of the
    reported type (``NameError``, ``ZeroDivisionError`` ...) with its message; any other failure as it is (a time
    limit is a ``TimeoutError``)."""
    from slimrl.rewards.sandbox_types import RaisedError

    if isinstance(failure, RaisedError):
        import builtins

        builtin = getattr(builtins, failure.error_type, None)
        if isinstance(builtin, type) and issubclass(builtin, Exception) and not issubclass(builtin, OSError):
            try:
                return builtin(str(failure))
            except TypeError:  # an exception type whose constructor takes other arguments
                return failure
    return failure


def create_locked_down_function(code: str) -> LockedDownFunction:
    """The single function ``code`` defines, run in the reward sandbox (module docstring). ``code`` must consist of
    one top-level ``def`` (imports inside it are fine); anything else is a ``ValueError``/``SyntaxError``."""
    tree = ast.parse(code)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    others = [type(n).__name__ for n in tree.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if len(defs) != 1 or others:
        raise ValueError(
            f"expected exactly one top-level function definition, found {len(defs)} function(s)"
            + (f" and other statements ({', '.join(others)})" if others else "")
        )
    return LockedDownFunction(code, defs[0].name)


def execute_with_time_limit(seconds: float) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the wrapped call raises ``TimeoutError`` once it has run ``seconds`` (module docstring)."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0:
        raise ValueError(f"execute_with_time_limit(seconds={seconds!r}): pass a positive number of seconds")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def limited(*args: Any, **kwargs: Any) -> Any:
            outer = getattr(_deadline, "at", None)
            _deadline.at = min(outer, time.monotonic() + seconds) if outer is not None else time.monotonic() + seconds
            try:
                if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
                    return _on_main_thread(fn, seconds, args, kwargs)
                return _on_helper_thread(fn, seconds, args, kwargs)
            finally:
                _deadline.at = outer

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
    at = getattr(_deadline, "at", None)

    def run() -> None:
        _deadline.at = at  # a locked-down function called in the helper thread keeps the caller's deadline
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
