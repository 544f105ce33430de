"""Run model-written Python in a separate, closed-in process: the reward sandbox.

A reward that executes what the policy wrote (a function to test, a program to score) runs here::

    from slimrl import run_sandboxed

    result = run_sandboxed(completion_code, call="solve", args=[[3, 1, 2]])
    reward = 1.0 if result.ok and result.value == [1, 2, 3] else 0.0

The code runs in its own Python process (``python -I -S``: no site-packages, no environment variables, no user
site) and the answer comes back as data, so a reward gets a :class:`SandboxResult` — the JSON value the called
function returned, or a typed failure (:class:`SandboxError` and its subclasses) — and never a hung, crashed or
poisoned trainer. Grade in the trainer, on the returned value: whatever the code does, it can at most choose what
it returns.

What closes the process in (``slimrl/rewards/_sandbox_child.py`` sets it up before the code runs):

* **time**: a wall-clock limit (the whole process group is killed at ``wall_s``) and a CPU-time limit
  (``RLIMIT_CPU``); either is :class:`TimeLimitError`;
* **memory**: an address-space limit (``RLIMIT_AS``): :class:`MemoryLimitError`;
* **processes**: ``RLIMIT_NPROC`` 0 (no fork, no exec of another program) and the audit events that start processes
  refused; a fork bomb ends as :class:`ForbiddenError` or with the fork failing in the code;
* **network**: a new (empty) network namespace where the kernel allows unprivileged user namespaces, and every
  ``socket.*`` audit event refused;
* **files**: the scratch directory (a fresh temporary directory per call, removed after) is the working directory
  and the only writable place; reads are limited to it and the standard library; a file written is at most
  ``file_mb``; started by root, the process runs as ``nobody``;
* **modules**: before anything runs, the code's imports are checked against ``allow`` (:data:`DEFAULT_MODULES`, the
  standard library's computation modules): another module is :class:`DisallowedImportError` without starting a process;
  at run time ``__import__`` admits the same list only, and the audit hook refuses loading any other module, so
  ``__import__('os')``, ``getattr(__builtins__, '__import__')`` or ``importlib`` tricks end the same way;
* **the trainer**: signalling other processes (``os.kill``), frame and garbage-collector introspection, ``ctypes``
  and ``mmap`` are refused.

``SandboxResult.isolation`` lists the layers that took effect on this machine.

What it does **not** protect against — do not use it as the only boundary for code from an adversary outside your
training run: a flaw in CPython or the kernel (an interpreter crash bug, a kernel exploit); an allowed module used
as its documentation says (an allowed module that itself reads files or opens sockets makes those possible within
the audit rules); reading files inside the standard library; CPU and memory contention with the trainer (the limits
bound the total, not the share: run rewards with fewer workers than cores); a wall-clock limit shorter than
Python's start-up (~20-40 ms); side channels. Where user namespaces are unavailable, the network is closed only by
the audit hook, and where the trainer does not run as root, ``os.kill`` of the trainer's processes is refused only
by it. For hostile code, run the sandbox inside a container or VM as well.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from slimrl.rewards.sandbox import check_python_modules

CHILD = Path(__file__).with_name("_sandbox_child.py")

DEFAULT_MODULES = frozenset({
    "math", "cmath", "random", "re", "string", "itertools", "functools", "operator", "collections", "heapq",
    "bisect", "statistics", "fractions", "decimal", "json", "typing", "dataclasses", "copy", "datetime", "enum",
    "textwrap", "unicodedata", "array", "numbers", "time"})


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one sandboxed call may use: ``wall_s`` seconds of real time, ``cpu_s`` of CPU time, ``memory_mb`` of
    address space, files up to ``file_mb``, ``open_files`` descriptors, ``output_kb`` of stdout/stderr kept."""

    wall_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    file_mb: int = 16
    open_files: int = 64
    output_kb: int = 64

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"Limits({field.name}={value!r}): pass a positive number")
        if self.memory_mb < 64:
            raise ValueError(f"Limits(memory_mb={self.memory_mb}): Python itself needs about 64 MB; pass >= 64")


class SandboxError(Exception):
    """Why a sandboxed call gave no value (a subclass says which); ``str()`` is the detail."""

    kind = "failure"


class TimeLimitError(SandboxError):
    """The wall-clock or CPU-time limit was reached."""

    kind = "timeout"


class MemoryLimitError(SandboxError):
    """The memory limit was reached."""

    kind = "memory"


class ForbiddenError(SandboxError):
    """The code did something the sandbox refuses (a process, a socket, a file outside the scratch directory, a
    signal, ctypes ...): the process was ended at that point."""

    kind = "forbidden"


class DisallowedImportError(SandboxError):
    """The code imports a module outside the allow-list (found before it ran, or when it tried)."""

    kind = "import"


class RaisedError(SandboxError):
    """The code raised an exception (or does not define the function to call); ``error_type`` names it."""

    kind = "error"

    def __init__(self, message: str, error_type: str = "Exception"):
        super().__init__(message)
        self.error_type = error_type


class CrashedError(SandboxError):
    """The process ended without an answer (a signal, ``os._exit``, an interpreter crash)."""

    kind = "crashed"


class BadResultError(SandboxError):
    """The function returned something that is not JSON data."""

    kind = "result"


_BY_KIND = {cls.kind: cls for cls in (TimeLimitError, MemoryLimitError, ForbiddenError, DisallowedImportError,
                                      RaisedError, BadResultError)}


@dataclasses.dataclass
class SandboxResult:
    """One sandboxed call: ``value`` (JSON data) when ``ok``, else ``failure``; the call's stdout/stderr (at most
    ``Limits.output_kb`` each), its wall time and the isolation layers that took effect."""

    value: Any = None
    failure: SandboxError | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    isolation: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.failure is None

    def unwrap(self) -> Any:
        """The value, or the failure raised."""
        if self.failure is not None:
            raise self.failure
        return self.value


def _readable_roots() -> list[str]:
    """The standard library's directories (pure and compiled modules): what an allowed module may read."""
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], str(Path(paths["stdlib"]) / "lib-dynload")}
    return sorted(r for r in roots if r and os.path.isdir(r))


def _check_request(code: Any, call: Any, args: Any, kwargs: Any, allow: Iterable[str]) -> None:
    if not isinstance(code, str):
        raise TypeError(f"run_sandboxed(code={type(code).__name__}): pass the Python source as a str")
    if call is not None and (not isinstance(call, str) or not call.isidentifier()):
        raise ValueError(f"run_sandboxed(call={call!r}): pass the name of a function the code defines, or None")
    try:
        json.dumps([list(args), dict(kwargs)])
    except (TypeError, ValueError) as err:
        raise TypeError(f"run_sandboxed(args=..., kwargs=...): the arguments must be JSON data ({err})") from None
    if isinstance(allow, str):
        raise TypeError("run_sandboxed(allow='...'): pass a collection of module names, e.g. {'math', 're'}")


def _tail(path: Path, kb: int) -> str:
    data = path.read_bytes()
    return data[-kb * 1024:].decode("utf-8", "replace")


def run_sandboxed(code: str, call: str | None = None, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
                  *, allow: Iterable[str] = DEFAULT_MODULES, limits: Limits | None = None) -> SandboxResult:
    """Run ``code`` (Python source) in the sandbox (module docstring); with ``call``, then call the function of that
    name with ``args``/``kwargs`` (JSON data) and return its value. Never raises for anything the code does: the
    failure is in the result."""
    kwargs = dict(kwargs or {})
    limits = limits or Limits()
    _check_request(code, call, args, kwargs, allow)
    allow = sorted(set(allow))
    _, info = check_python_modules(code)  # its verdict is the stdlib test; the allow-list decides here
    if "error" in info:
        return SandboxResult(failure=RaisedError(info["error"], "SyntaxError"))
    outside = sorted((set(info["stdlib"]) | set(info["non_stdlib"])) - set(allow))
    if outside or info["relative_imports"]:
        what = ", ".join(outside) if outside else "a relative import"
        return SandboxResult(failure=DisallowedImportError(f"the code imports {what} (allowed: {', '.join(allow)})"))
    work = tempfile.mkdtemp(prefix="slimrl-sandbox-")
    try:
        return _run(code, call, list(args), kwargs, allow, limits, Path(work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(code: str, call: str | None, args: list, kwargs: dict, allow: list[str], limits: Limits,
         work: Path) -> SandboxResult:
    scratch = work / "scratch"
    scratch.mkdir()
    # whoever the child ends up as (``nobody`` when started by root, an unmapped user inside its user namespace):
    # the private temporary directory may be passed through, the scratch directory written
    work.chmod(0o711)
    scratch.chmod(0o777)
    request = {"code": code, "call": call, "args": args, "kwargs": kwargs, "allow": allow, "scratch": str(scratch),
               "readable": _readable_roots(), "limits": dataclasses.asdict(limits)}
    env = {"PATH": "", "HOME": str(scratch), "TMPDIR": str(scratch), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = before.ru_utime + before.ru_stime
    with open(work / "result", "w+b") as result, open(work / "stdout", "w+b") as out, \
            open(work / "stderr", "w+b") as err:
        request["result_fd"] = result.fileno()  # inherited under the same number (pass_fds)
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(CHILD)], stdin=subprocess.PIPE, stdout=out,
                                stderr=err, env=env, cwd=str(scratch), start_new_session=True,
                                pass_fds=(result.fileno(),))
        try:
            proc.stdin.write(json.dumps(request).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_s = usage.ru_utime + usage.ru_stime - cpu_before
        seconds = time.perf_counter() - started
        stdout, stderr = _tail(work / "stdout", limits.output_kb), _tail(work / "stderr", limits.output_kb)
        raw = (work / "result").read_bytes()
    base = dict(stdout=stdout, stderr=stderr, seconds=seconds)
    if timed_out:
        return SandboxResult(failure=TimeLimitError(f"wall-clock limit of {limits.wall_s:g} s"), **base)
    try:
        message = json.loads(raw) if raw else None
    except ValueError:
        message = None
    if not isinstance(message, dict):
        return SandboxResult(failure=_ended(proc.returncode, limits, stderr, cpu_s), **base)
    layers = tuple(message.get("layers", ()))
    kind = message.get("failure")
    if kind is None:
        return SandboxResult(value=message.get("value"), isolation=layers, **base)
    if kind == "error":
        failure: SandboxError = RaisedError(message.get("message", ""), message.get("error_type", "Exception"))
    elif kind == "memory":
        failure = MemoryLimitError(f"memory limit of {limits.memory_mb} MB (MemoryError)")
    else:
        failure = _BY_KIND.get(kind, CrashedError)(message.get("message", ""))
    return SandboxResult(failure=failure, isolation=layers, **base)


def _kill_group(proc: subprocess.Popen) -> None:
    """The child and anything it started, gone (its own session: one process group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _ended(returncode: int, limits: Limits, stderr: str, cpu_s: float) -> SandboxError:
    """The failure of a process that left no answer (``cpu_s``: the CPU time it used)."""
    if returncode == -signal.SIGKILL and cpu_s >= max(1, round(limits.cpu_s)):  # the hard CPU limit
        return TimeLimitError(f"CPU-time limit of {limits.cpu_s:g} s")
    if returncode == -signal.SIGXCPU:
        return TimeLimitError(f"CPU-time limit of {limits.cpu_s:g} s")
    if "MemoryError" in stderr:
        return MemoryLimitError(f"memory limit of {limits.memory_mb} MB")
    if returncode is not None and returncode < 0:
        return CrashedError(f"ended by signal {signal.Signals(-returncode).name}")
    return CrashedError(f"exited with status {returncode} without an answer")
