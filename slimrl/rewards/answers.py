"""The answer of a sandboxed call, as the trainer reads it: framing (an 8-byte length, then JSON), and the parse
into a bounded, checked :class:`~slimrl.rewards.sandbox_types.SandboxResult` — a JSON object of known keys and
kinds, at most :data:`MAX_DEPTH` deep; anything else is a typed failure, never an exception in the trainer."""

from __future__ import annotations

import json
import signal
from typing import Any

from slimrl.rewards.sandbox_types import (
    BY_KIND,
    BadResultError,
    CrashedError,
    IsolationError,
    Limits,
    MemoryLimitError,
    RaisedError,
    SandboxError,
    SandboxResult,
    TimeLimitError,
)

SETUP_FAILED = 70  # the launcher's exit status when a kernel layer could not be built
ALLOW_HINT = (
    "To allow it: run as root, or allow unprivileged user namespaces (sysctl user.max_user_namespaces=15000 "
    "and, where present, kernel.unprivileged_userns_clone=1 or "
    "kernel.apparmor_restrict_unprivileged_userns=0; in Docker, --security-opt seccomp=unconfined), "
    "install libseccomp (apt install libseccomp2) — or pass isolation='none' to run without kernel "
    "isolation"
)
MAX_DEPTH = 100  # the deepest JSON nesting an answer may have


def frame(message: dict) -> bytes:
    """A message as the child reads it: an 8-byte big-endian length, then the JSON."""
    data = json.dumps(message).encode()
    return len(data).to_bytes(8, "big") + data


def unframe(raw: bytes) -> bytes | None:
    """The first message of ``raw`` (see :func:`frame`); None when ``raw`` holds no whole message."""
    if len(raw) < 8 or len(raw) < 8 + int.from_bytes(raw[:8], "big"):
        return None
    return raw[8 : 8 + int.from_bytes(raw[:8], "big")]


def parse_answer(raw: bytes, returncode: int, limits: Limits, stderr: str, cpu_s: float, base: dict) -> SandboxResult:
    """The result from the answer's bytes, checked: a JSON object of known keys and kinds, at most
    :data:`MAX_DEPTH` deep; anything else is a :class:`BadResultError` (or the process's own ending)."""
    if not raw:
        return SandboxResult(failure=ended(returncode, limits, stderr, cpu_s), **base)
    body = unframe(raw)
    if body is None:
        return SandboxResult(failure=BadResultError("the answer is cut short or malformed"), **base)
    try:
        message = json.loads(body)
    except (ValueError, RecursionError, MemoryError) as exc:
        return SandboxResult(failure=BadResultError(f"the answer is not valid JSON ({type(exc).__name__})"), **base)
    if not isinstance(message, dict) or not set(message) <= {"value", "failure", "message", "error_type", "layers"}:
        return SandboxResult(failure=BadResultError("the answer has an unknown shape"), **base)
    if depth(message.get("value")) > MAX_DEPTH:
        return SandboxResult(failure=BadResultError(f"the value is nested deeper than {MAX_DEPTH}"), **base)
    layers = message.get("layers", [])
    layers = tuple(x for x in layers if isinstance(x, str))[:16] if isinstance(layers, list) else ()
    kind, detail = message.get("failure"), str(message.get("message", ""))[:2000]
    if not isinstance(kind, str | None):  # a forged answer ({"failure": [1]}): a typed failure, never an exception
        return SandboxResult(failure=BadResultError("the answer's failure is not a name"), **base)
    if kind is None and "value" in message:
        return SandboxResult(value=message["value"], isolation=layers, **base)
    if kind == "error":
        failure: SandboxError = RaisedError(detail, str(message.get("error_type", "Exception"))[:100])
    elif kind == "memory":
        failure = MemoryLimitError(f"memory limit of {limits.memory_mb} MB (MemoryError)")
    elif kind == "isolation":  # the launcher's own diagnosis of its view carries its remedy
        failure = IsolationError(detail if message.get("error_type") == "view" else f"{detail}. {ALLOW_HINT}")
    elif kind in BY_KIND:
        failure = BY_KIND[kind](detail)
    else:
        failure = BadResultError("the answer names no value and no known failure")
    return SandboxResult(failure=failure, isolation=layers, **base)


def depth(value: Any) -> int:
    """How deeply ``value`` nests (iteratively: a hostile depth cannot overflow the trainer's stack)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            break
        if isinstance(item, dict):
            todo.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            todo.extend((v, level + 1) for v in item)
    return deepest


def ended(returncode: int, limits: Limits, stderr: str, cpu_s: float) -> SandboxError:
    """The failure of a process that left no answer (``cpu_s``: the CPU time it used). The launcher reports a
    signal that ended the child as 128 + its number."""
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= max(1, round(limits.cpu_s))):
        return TimeLimitError(f"CPU-time limit of {limits.cpu_s:g} s")
    if "MemoryError" in stderr:
        return MemoryLimitError(f"memory limit of {limits.memory_mb} MB")
    if returncode == SETUP_FAILED:
        return IsolationError(f"the sandbox could not be built (no message from the launcher). {ALLOW_HINT}")
    if sig:
        try:
            return CrashedError(f"ended by signal {signal.Signals(sig).name}")
        except ValueError:
            return CrashedError(f"ended by signal {sig}")
    return CrashedError(f"exited with status {returncode} without an answer")
