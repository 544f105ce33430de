"""A sandboxed process that keeps one function of model-written code loaded and answers call after call: what
Unsloth's ``create_locked_down_function`` returns here (a game strategy called once per move would pay a process
start per call otherwise). Same isolation as :func:`~slimrl.rewards.process_sandbox.run_sandboxed`; each call has
its own deadline; a call that fails by time, memory or a crash ends the process, and the next call starts a fresh
one (the function is rebuilt from its source: it keeps no state between failures)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from slimrl.rewards.answers import frame, parse_answer, unframe
from slimrl.rewards.channels import read_channels
from slimrl.rewards.process_sandbox import DEFAULT_MODULES, _check_request, _feed, _kill_group, _remove, _screen, _spawn
from slimrl.rewards.sandbox_types import BadResultError, Limits, SandboxResult, TimeLimitError
from slimrl.rewards.sandbox_view import readable_roots

CPU_CALLS = 100  # a session's CPU-time limit is this many calls' worth of Limits.cpu_s (deadlines bound each call)


TUPLE = "__slimrl_tuple__"  # how the child tags a tuple in a session's answer (_sandbox_child._tag_tuples)


def _untag(value: Any) -> Any:
    """Tuples back from their tags (the answer's depth is already checked: at most 100)."""
    if isinstance(value, dict):
        if set(value) == {TUPLE} and isinstance(value[TUPLE], list):
            return tuple(_untag(v) for v in value[TUPLE])
        return {k: _untag(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untag(v) for v in value]
    return value


class SandboxSession:
    """``code`` run once in the sandbox, then ``call``-ed with JSON arguments as many times as asked."""

    def __init__(
        self,
        code: str,
        call: str,
        *,
        allow: Iterable[str] = DEFAULT_MODULES,
        limits: Limits | None = None,
        isolation: str = "kernel",
    ) -> None:
        _check_request(code, call, (), {}, allow, isolation)
        self.code, self.name, self.allow = code, call, sorted(set(allow))
        self.limits, self.isolation = limits or Limits(), isolation
        self._refused, self._preload = _screen(code, self.allow)
        self._proc = self._result_r = self._work = None

    def _start(self) -> None:
        self._work = Path(tempfile.mkdtemp(prefix="slimrl-sandbox-"))
        limits = dataclasses.replace(self.limits, cpu_s=self.limits.cpu_s * CPU_CALLS)
        self._result_r, result_w = os.pipe()
        request = {
            "code": self.code,
            "call": self.name,
            "args": [],
            "kwargs": {},
            "allow": self.allow,
            "scratch": "/scratch",
            "readable": readable_roots(),
            "limits": dataclasses.asdict(limits),
            "isolation": self.isolation,
            "result_fd": result_w,
            "audit": True,
            "serve": True,
            "preload": self._preload,
        }
        try:
            self._proc = _spawn(request, self.isolation, limits, self._work, result_w, quiet=True)
        finally:
            os.close(result_w)
        _feed(self._proc, frame(request), close=False).join()

    def call(self, args: list | tuple = (), kwargs: dict | None = None, timeout: float | None = None) -> SandboxResult:
        """One call: the function's value, or the typed failure (never raised). ``timeout``: seconds for this call
        (default ``Limits.wall_s``)."""
        if self._refused is not None:
            return self._refused
        try:
            json.dumps([list(args), dict(kwargs or {})])
        except (TypeError, ValueError) as err:
            raise TypeError(f"a sandboxed function takes JSON data (lists, dicts, numbers, strings): {err}") from None
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._start()
        else:
            self._signal(signal.SIGCONT)  # frozen since its last answer
        started = time.perf_counter()
        _feed(self._proc, frame({"args": list(args), "kwargs": dict(kwargs or {})}), close=False).join(1)
        cap = self.limits.result_kb * 1024
        got = read_channels(
            {"result": self._result_r},
            deadline=started + (timeout or self.limits.wall_s),
            caps={"result": cap},
            keep={},
            until=lambda g: unframe(g.data["result"]) is not None,
        )
        base = {"seconds": time.perf_counter() - started}
        if got.timed_out:
            self.close()
            return SandboxResult(failure=TimeLimitError(f"time limit of {timeout or self.limits.wall_s:g} s"), **base)
        if got.over["result"]:
            self.close()
            return SandboxResult(failure=BadResultError(f"the answer is over {self.limits.result_kb} kB"), **base)
        if unframe(got.data["result"]) is None:  # the process ended without answering
            self._proc.wait()
            returncode = self._proc.returncode
            self.close()
            return parse_answer(b"", returncode, self.limits, "", 0.0, base)
        result = parse_answer(got.data["result"], 0, self.limits, "", 0.0, base)
        self._signal(signal.SIGSTOP)  # nothing runs between calls: a background thread would compute unmetered
        if result.ok:
            result.value = _untag(result.value)
        return result

    def _signal(self, sig: int) -> None:
        """``sig`` to the session's whole process group (the launcher, its namespace and the code's threads; the
        code can leave neither: seccomp refuses setsid and setpgid)."""
        try:
            os.killpg(self._proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        """The process gone (the next call starts a fresh one)."""
        if self._proc is not None:
            _kill_group(self._proc)
            try:
                self._proc.stdin.close()
            except (OSError, ValueError):
                pass
            self._proc = None
        if self._result_r is not None:
            os.close(self._result_r)
            self._result_r = None
        if self._work is not None:
            _remove(self._work)
            self._work = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
