"""Run model-written Python in a separate process the kernel closes in: the reward sandbox.

A reward that executes what the policy wrote (a function to test, a program to score) runs here::

    from slimrl import run_sandboxed

    result = run_sandboxed(completion_code, call="solve", args=[[3, 1, 2]])
    reward = 1.0 if result.ok and result.value == [1, 2, 3] else 0.0

The answer comes back as data: a :class:`SandboxResult` with the JSON value the called function returned, or a typed
failure (:class:`SandboxError` subclasses). ``run_sandboxed`` never raises for anything the code does, the parsing
of its answer included; only a wrong call by the reward's author (a non-string code, non-JSON arguments) raises.

**Threat model.** The code is hostile: RL optimises for whatever earns reward, reaching outside included. What
holds, enforced by the kernel before the first byte of it runs (``_sandbox_launch.py``, ``_sandbox_child.py``):

* its own user, mount, PID, network, IPC and UTS namespaces; inside, an unprivileged user (``nobody`` outside when
  the trainer is root, the trainer's user otherwise) with no capability and no way to gain one (``no_new_privs``);
* a filesystem of its own: the interpreter, its standard library and the system libraries read-only, a tmpfs
  scratch of ``Limits.disk_mb`` as the only writable place, no ``/proc``; nothing else of the machine exists for it
  (Landlock adds the same rule as a second layer where the kernel has it, and scopes signals);
* a seccomp filter: no new process, no socket, no ``ptrace``, no signal to another process, no mount, namespace,
  ``io_uring``, BPF or keyring call;
* when the call ends (answer, limit or crash), the PID namespace ends and every process in it with it; the chain of
  processes dies with the trainer too (``PR_SET_PDEATHSIG``);
* resource limits (CPU seconds, address space, file size, open files) and a wall-clock deadline kept by the trainer;
* the channels are pipes the trainer owns and reads with a deadline and a size cap (``Limits.output_kb``,
  ``result_kb``); the answer is parsed into a bounded, checked shape;
* an environment with nothing of the trainer's.

The audit hook of the child stays as a further layer: it turns the common refusals (a file outside scratch, an
import outside ``allow``, a socket) into a clear :class:`ForbiddenError`/:class:`DisallowedImportError`; the kernel
layers hold when it is bypassed.

What it does **not** promise: safety from a kernel or CPython exploit (use a VM for code from outside your training
run), from CPU or memory contention with the trainer (limits bound the total, not the share), from side channels,
or from an allowed module used as documented. Where the kernel offers no unprivileged user namespaces (some
containers; macOS), or libseccomp is missing, ``run_sandboxed`` refuses with an :class:`IsolationError` naming what is
missing and how to allow it — never a silent downgrade; ``isolation="none"`` runs the code in a plain child process
(resource limits and the audit hook only) by the caller's explicit choice. ``slimrl doctor`` reports the layers this
machine gives (:func:`isolation_report`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from slimrl.compat.runtime.processes import descendants, reaps_orphans
from slimrl.rewards.answers import frame, parse_answer
from slimrl.rewards.channels import read_channels
from slimrl.rewards.module_check import check_python_modules
from slimrl.rewards.sandbox_types import (
    BadResultError,
    CrashedError,
    DisallowedImportError,
    ForbiddenError,
    IsolationError,
    Limits,
    MemoryLimitError,
    RaisedError,
    SandboxError,
    SandboxResult,
    TimeLimitError,
)
from slimrl.rewards.sandbox_view import interpreter, launcher_config, readable_roots

__all__ = [
    "run_sandboxed",
    "isolation_report",
    "Limits",
    "SandboxResult",
    "SandboxError",
    "TimeLimitError",
    "MemoryLimitError",
    "ForbiddenError",
    "DisallowedImportError",
    "RaisedError",
    "CrashedError",
    "BadResultError",
    "IsolationError",
    "DEFAULT_MODULES",
]

HERE = Path(__file__).resolve().parent
CHILD, LAUNCHER = HERE / "_sandbox_child.py", HERE / "_sandbox_launch.py"
ISOLATIONS = ("kernel", "none")
DEFAULT_MODULES = frozenset(
    {
        "math",
        "cmath",
        "random",
        "re",
        "string",
        "itertools",
        "functools",
        "operator",
        "collections",
        "heapq",
        "bisect",
        "statistics",
        "fractions",
        "decimal",
        "json",
        "typing",
        "dataclasses",
        "copy",
        "datetime",
        "enum",
        "textwrap",
        "unicodedata",
        "array",
        "numbers",
        "time",
    }
)


def _check_request(code: Any, call: Any, args: Any, kwargs: Any, allow: Iterable[str], isolation: Any) -> None:
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
    if isolation not in ISOLATIONS:
        raise ValueError(f"run_sandboxed(isolation={isolation!r}): pass 'kernel' (the default) or 'none'")
    if isolation == "none" and not _NONE_WARNED:
        _NONE_WARNED.append(True)
        from slimrl.compat.runtime.callsite import warn

        warn(
            "run_sandboxed(isolation='none'): the code runs as a plain child process — no namespaces, no read-only "
            "view, no seccomp filter, no Landlock; only the resource limits and the audit hook (which code can get "
            "around) stand between it and your files, your Hub token and the trainer's processes",
            UserWarning,
        )


_NONE_WARNED: list[bool] = []


def _screen(code: str, allow: list[str]) -> tuple[SandboxResult | None, list[str]]:
    """The imports checked before any process starts: (a failure result or None, the modules the code imports).
    Degenerate code (a parse that recurses too deep or runs out of memory) is a typed failure too."""
    try:
        _, info = check_python_modules(code)
    except (RecursionError, MemoryError, ValueError, OverflowError) as exc:
        return SandboxResult(
            failure=RaisedError(f"the code cannot be parsed: {type(exc).__name__}", type(exc).__name__)
        ), []
    if "error" in info:
        return SandboxResult(failure=RaisedError(info["error"], "SyntaxError")), []
    imported = set(info["stdlib"]) | set(info["non_stdlib"])
    outside = sorted(imported - set(allow))
    if outside or info["relative_imports"]:
        what = ", ".join(outside) if outside else "a relative import"
        shown = ", ".join(allow) if len(allow) < 40 else f"{len(allow)} standard-library modules"
        return SandboxResult(failure=DisallowedImportError(f"the code imports {what} (allowed: {shown})")), []
    return None, sorted(imported)


def run_sandboxed(
    code: str,
    call: str | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    allow: Iterable[str] = DEFAULT_MODULES,
    limits: Limits | None = None,
    isolation: str = "kernel",
    audit_hook: bool = True,
) -> SandboxResult:
    """Run ``code`` (Python source) in the sandbox (module docstring); with ``call``, then call the function of that
    name with ``args``/``kwargs`` (JSON data) and return its value. Never raises for anything the code does: the
    failure is in the result. ``isolation``: ``"kernel"`` (default) or ``"none"`` (module docstring);
    ``audit_hook=False`` leaves the in-process hook out, so only the kernel layers hold (the tests show they do)."""
    kwargs = dict(kwargs or {})
    limits = limits or Limits()
    _check_request(code, call, args, kwargs, allow, isolation)
    allow = sorted(set(allow))
    screened, imported = _screen(code, allow)
    if screened is not None:
        return screened
    work = Path(tempfile.mkdtemp(prefix="slimrl-sandbox-"))
    try:
        return _run(code, call, list(args), kwargs, allow, limits, isolation, work, audit_hook, imported)
    except OSError as exc:  # the trainer's side could not start or read the process
        return SandboxResult(failure=CrashedError(f"the sandbox could not run: {exc}"))
    finally:
        _remove(work)


def _remove(work: Path) -> None:
    import shutil

    root = work / "root"
    if root.is_dir() and os.path.ismount(root):  # never: the view lives in the sandbox's own mount namespace
        return
    shutil.rmtree(work, ignore_errors=True)


def _spawn(
    request: dict, isolation: str, limits: Limits, work: Path, result_w: int, quiet: bool = False
) -> subprocess.Popen:
    env = {"PATH": "", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    if isolation == "kernel":
        (work / "root").mkdir(mode=0o700)
        cfg = launcher_config(work / "root", CHILD, limits, result_w)
        request["scratch"] = cfg["scratch"]  # /scratch, unless something bound lives there
        argv = [interpreter(), "-I", "-S", str(LAUNCHER), json.dumps(cfg)]
        cwd = "/"
    else:
        scratch = work / "scratch"
        scratch.mkdir()
        work.chmod(0o711)  # whoever the child becomes (nobody when started by root) may pass through and write
        scratch.chmod(0o777)
        request["scratch"] = str(scratch)
        env.update(HOME=str(scratch), TMPDIR=str(scratch))
        argv, cwd = [interpreter(), "-I", "-S", str(CHILD)], str(scratch)
    out = subprocess.DEVNULL if quiet else subprocess.PIPE  # quiet: a session, whose output nobody reads
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=out,
        stderr=out,
        env=env,
        cwd=cwd,
        start_new_session=True,
        pass_fds=(result_w,),
    )


def _feed(proc: subprocess.Popen, data: bytes, close: bool = True) -> threading.Thread:
    """``data`` written to the process's stdin from a thread (a child that never reads cannot block us)."""

    def write() -> None:
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
            if close:
                proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass

    thread = threading.Thread(target=write, name="slimrl-sandbox-feed", daemon=True)
    thread.start()
    return thread


def _run(
    code: str,
    call: str | None,
    args: list,
    kwargs: dict,
    allow: list[str],
    limits: Limits,
    isolation: str,
    work: Path,
    audit_hook: bool = True,
    preload: list[str] = (),
) -> SandboxResult:
    result_r, result_w = os.pipe()
    request = {
        "code": code,
        "call": call,
        "args": args,
        "kwargs": kwargs,
        "allow": allow,
        "scratch": "/scratch",
        "readable": readable_roots(),
        "limits": dataclasses.asdict(limits),
        "isolation": isolation,
        "result_fd": result_w,
        "audit": audit_hook,
        "preload": list(preload),
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    try:
        proc = _spawn(request, isolation, limits, work, result_w)
    finally:
        os.close(result_w)
    try:
        feeder = _feed(proc, frame(request))
        got = read_channels(
            {"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(), "result": result_r},
            deadline=started + limits.wall_s,
            caps={"stdout": 64 * 2**20, "stderr": 64 * 2**20, "result": limits.result_kb * 1024},
            keep={"stdout": limits.output_kb * 1024, "stderr": limits.output_kb * 1024},
        )
    finally:
        _kill_group(proc)
        os.close(result_r)
        proc.stdout.close()
        proc.stderr.close()
    feeder.join(timeout=1)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
    text = {k: got.data[k].decode("utf-8", "replace") for k in ("stdout", "stderr")}
    base = dict(stdout=text["stdout"], stderr=text["stderr"], seconds=time.perf_counter() - started)
    if got.over.get("result"):
        return SandboxResult(failure=BadResultError(f"the answer is over {limits.result_kb} kB"), **base)
    if got.over.get("stdout") or got.over.get("stderr"):
        return SandboxResult(failure=ForbiddenError("the code wrote more than 64 MB of output"), **base)
    if got.timed_out:
        return SandboxResult(failure=TimeLimitError(f"wall-clock limit of {limits.wall_s:g} s"), **base)
    return parse_answer(got.data["result"], proc.returncode, limits, text["stderr"], cpu_s, base)


def _kill_group(proc: subprocess.Popen) -> None:
    """The launcher and its process group gone; the namespaces' processes follow it (parent-death signals, and the
    PID namespace ends with its first process). Where the trainer is PID 1 (a container without an init) or a
    subreaper, the launcher's own children are re-parented to it when the launcher dies: they are reaped here, by
    their process ids only (no other child's exit status is taken)."""
    below = descendants(proc.pid) if reaps_orphans() else set()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    deadline = time.monotonic() + 2.0
    while below and time.monotonic() < deadline:
        for pid in list(below):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not (yet) ours: gone once whoever it belongs to has reaped it
                done = not os.path.exists(f"/proc/{pid}")
            if done:
                below.discard(pid)
        if below:
            time.sleep(0.01)


def isolation_report() -> dict[str, Any]:
    """The layers the kernel isolation gives on this machine (one trivial sandboxed call), or why it cannot run:
    ``{"ok": bool, "layers": [...], "missing": str | None}`` (``slimrl doctor``)."""
    result = run_sandboxed("def f():\n    return 1\n", call="f", limits=Limits(wall_s=20, cpu_s=5))
    if result.ok:
        return {"ok": True, "layers": list(result.isolation), "missing": None}
    return {"ok": False, "layers": list(result.isolation), "missing": str(result.failure)}


if sys.platform != "linux":  # the kernel layers are Linux's; elsewhere only an explicit isolation="none" runs
    _linux_run = _run

    def _run(code, call, args, kwargs, allow, limits, isolation, work, audit_hook=True, preload=()):  # noqa: D103
        if isolation == "kernel":
            return SandboxResult(
                failure=IsolationError(
                    f"the reward sandbox's kernel isolation needs Linux (this is {sys.platform}); run the trainer in a "
                    "Linux VM or container, or pass isolation='none' to run without it"
                )
            )
        return _linux_run(code, call, args, kwargs, allow, limits, isolation, work, audit_hook, preload)
