"""The process that runs the code: ``python -I -S _sandbox_child.py`` (exec'd by ``_sandbox_launch.py`` inside the
namespaces, or started directly with ``isolation="none"``).

Standard library only. It reads one JSON request from stdin, closes itself in, runs the code and writes one JSON
answer to the result pipe (``result_fd``, whose reading end only the trainer holds). Every step before the code runs
is the trusted part; the order matters:

1. the modules the code imports are imported (so their own dependencies are loaded while nothing is refused);
2. resource limits: CPU seconds, address space, largest file written, open files, no core file (and with
   ``isolation="none"``, no new process nor thread);
3. kernel isolation only: the seccomp filter (``_sandbox_kernel.seccomp``: no process, socket, ptrace, signal to
   another process, mount or namespace change; the kernel refuses it whatever the code does in this interpreter);
   ``isolation="none"`` only: as root, drop to ``nobody`` where it can read the standard library, and a network
   namespace where the kernel allows one;
4. the audit hook, a further layer that turns the common refusals into clear answers: any event in ``FORBIDDEN``
   or a file access outside the scratch directory (writes) or outside the scratch directory and the standard
   library (reads) ends the process with a ``forbidden`` answer; frame and garbage-collector introspection is
   refused with ``ValueError``. Its rules live in the hook's closure (frozen sets), not in globals the code could
   reassign;
5. the code runs with builtins whose ``__import__`` admits the allowed modules only.
"""

from __future__ import annotations

import builtins
import json
import os
import sys

NOBODY = 65534

FORBIDDEN = (
    "socket.",
    "ctypes.",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "subprocess.Popen",
    "os.kill",
    "os.killpg",
    "signal.pthread_kill",
    "pty.spawn",
    "os.chdir",
    "os.chroot",
    "mmap.__new__",
    "resource.setrlimit",
    "resource.prlimit",
    "os.setuid",
    "os.setsid",
    "marshal.load",
    "pickle.find_class",
    "sys.settrace",
    "sys.setprofile",
    "webbrowser.open",
    "urllib.Request",
    "http.client.connect",
    "ftplib.connect",
    "smtplib.connect",
    "imaplib.open",
    "poplib.connect",
    "telnetlib.Telnet.open",
    "os.startfile",
    "winreg.",
    "sys.addaudithook",
)
INTROSPECTION = (
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "sys._getframe",
    "sys._current_frames",
    "object.__getattr__",
)
WRITES = {
    "os.remove": 1,
    "os.rmdir": 1,
    "os.rename": 2,
    "os.replace": 2,
    "os.mkdir": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.link": 2,
    "os.symlink": 2,
    "os.truncate": 1,
    "os.utime": 1,
    "os.chflags": 1,
    "shutil.rmtree": 1,
    "shutil.copyfile": 2,
    "shutil.copytree": 2,
    "shutil.move": 2,
    "shutil.chown": 1,
}
LISTINGS = ("os.listdir", "os.scandir", "glob.glob", "os.walk")


def read_frame(fd: int) -> bytes | None:
    """One message from ``fd``: an 8-byte big-endian length, then that many bytes; None at end of file."""
    head = b""
    while len(head) < 8:
        chunk = os.read(fd, 8 - len(head))
        if not chunk:
            return None
        head += chunk
    size, body = int.from_bytes(head, "big"), b""
    while len(body) < size:
        chunk = os.read(fd, min(size - len(body), 1 << 20))
        if not chunk:
            return None
        body += chunk
    return body


def answerer(fd: int):
    """The function that writes one answer, framed as :func:`read_frame` reads it, to the result pipe ``fd`` (bound
    in its closure)."""
    dumps, write = json.dumps, os.write

    def answer(message: dict) -> None:
        data = dumps(message).encode()
        data = len(data).to_bytes(8, "big") + data
        try:
            while data:
                data = data[write(fd, data) :]
        except OSError:
            pass

    return answer


def _legacy_close_in() -> list[str]:
    """``isolation="none"``: the layers a process can add to itself (module docstring, step 3)."""
    layers = []
    if os.geteuid() == 0:
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            layers.append("user nobody")
        except OSError:
            pass
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).unshare(0x10000000 | 0x40000000) == 0:
            layers.append("network namespace")
    except (OSError, AttributeError):
        pass
    return layers


TASKS = 64  # threads one call may have under kernel isolation (counted in its own user namespace)


def set_limits(limits: dict, processes: bool) -> None:
    """The resource limits; ``processes``: also no new process (``RLIMIT_NPROC`` 0, which forbids threads too —
    under kernel isolation seccomp refuses processes, and ``RLIMIT_NPROC`` caps the threads at :data:`TASKS`: the
    kernel counts them per user namespace, so the cap is this call's alone and the trainer keeps its own PIDs)."""
    import resource

    mb, cpu = 2**20, max(1, round(limits["cpu_s"]))
    tasks = 0 if processes else TASKS
    for which, soft, hard in (
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL after
        (resource.RLIMIT_AS, limits["memory_mb"] * mb, limits["memory_mb"] * mb),
        (resource.RLIMIT_FSIZE, limits["file_mb"] * mb, limits["file_mb"] * mb),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NPROC, tasks, tasks),
    ):
        try:
            resource.setrlimit(which, (soft, hard))
        except (OSError, ValueError):
            continue


def install_guard(scratch: str, readable: tuple[str, ...], allowed: frozenset[str], answer) -> None:
    """Step 4: the audit hook (irrevocable: Python offers no way to remove one). Everything it reads is bound here."""
    writable = (os.path.realpath(scratch),)
    reads = writable + tuple(os.path.realpath(r) for r in readable)
    forbidden, introspection, writes, listings = FORBIDDEN, INTROSPECTION, dict(WRITES), LISTINGS
    realpath, fsdecode, sep, write, exit_now = os.path.realpath, os.fsdecode, os.sep, answer, os._exit
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def inside(path: object, roots: tuple[str, ...]) -> bool:
        if isinstance(path, int):
            return True  # an already open descriptor: its opening was checked
        try:
            real = realpath(fsdecode(path))
        except (TypeError, ValueError):
            return False
        return any(real == r or real.startswith(r + sep) for r in roots)

    def refuse(what: str) -> None:
        write({"failure": "forbidden", "message": what})
        exit_now(86)

    def guard(event: str, args: tuple) -> None:
        if event.startswith(introspection):
            raise ValueError(f"{event} is not allowed in the sandbox")
        if event.startswith(forbidden):
            refuse(f"{event} is not allowed in the sandbox")
        elif event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                isinstance(flags, int) and bool(flags & write_flags)
            )
            if not inside(path, writable if writing else reads):
                refuse(f"{'writing' if writing else 'reading'} {fsdecode(path)!s} (outside the scratch directory)")
        elif event in writes:
            for path in args[: writes[event]]:
                if path is not None and not inside(path, writable):
                    refuse(f"{event} on {path!s} (outside the scratch directory)")
        elif event in listings:
            if args and args[0] is not None and not inside(args[0], reads):
                refuse(f"{event} of {args[0]!s} (outside the scratch directory)")
        elif event == "import" and str(args[0]).split(".")[0] not in allowed:
            refuse(f"import of {args[0]} (not an allowed module)")

    sys.addaudithook(guard)


def restricted_builtins(allowed: frozenset[str], answer) -> dict:
    real_import = builtins.__import__

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        """The code's ``__import__``: allowed modules only, no relative import."""
        if level or name.split(".")[0] not in allowed:
            answer({"failure": "import", "message": f"import of {name!r} (allowed: {', '.join(sorted(allowed))})"})
            os._exit(87)
        return real_import(name, globals, locals, fromlist, level)

    names = dict(vars(builtins))
    for name in ("breakpoint", "input", "help", "exit", "quit", "copyright", "credits", "license"):
        names.pop(name, None)
    names["__import__"] = guarded_import
    return names


def main() -> None:
    request = json.loads(read_frame(0))
    answer = answerer(request["result_fd"])
    allowed = frozenset(request["allow"])
    kernel = request["isolation"] == "kernel"
    for module in sorted(set(request.get("preload", ())) | {"resource"} | (set() if kernel else {"ctypes"})):
        try:
            __import__(module)  # what the code imports, loaded (with what it needs) before anything is refused
        except ImportError:
            pass
    layers = [x for x in os.environ.get("SLIMRL_SANDBOX_LAYERS", "").split(",") if x] if kernel else _legacy_close_in()
    set_limits(request["limits"], processes=not kernel)
    layers.append("resource limits")
    if kernel:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _sandbox_kernel

        try:
            _sandbox_kernel.seccomp(os.getpid())
        except OSError as exc:
            answer({"failure": "isolation", "message": f"the seccomp filter could not be loaded: {exc}"})
            os._exit(70)
        sys.path.pop(0)
        layers.append("seccomp")
    scratch = request["scratch"]
    os.chdir(scratch)
    if request.get("audit", True):
        install_guard(scratch, tuple(request["readable"]), allowed, answer)
        layers.append("audit hook")
    namespace = {"__builtins__": restricted_builtins(allowed, answer), "__name__": "__sandbox__"}
    try:
        exec(compile(request["code"], "<sandboxed code>", "exec"), namespace)  # noqa: S102 - the sandbox's job
    except BaseException as err:  # noqa: BLE001 - the code's own failure, reported by type
        answer(_failure(err, layers))
        return
    fn = namespace.get(request["call"]) if request["call"] is not None else None
    if request["call"] is not None and not callable(fn):
        answer(
            {
                "failure": "error",
                "error_type": "NameError",
                "layers": layers,
                "message": f"the code defines no function {request['call']!r}",
            }
        )
        return
    if not request.get("serve"):
        answer(_call(fn, request["args"], request["kwargs"], layers))
        return
    while (frame := read_frame(0)) is not None:  # a session: one call per message until the trainer closes stdin
        message = json.loads(frame)
        answer(_call(fn, message["args"], message["kwargs"], layers, tuples=True))


def _failure(err: BaseException, layers: list[str]) -> dict:
    if isinstance(err, MemoryError):
        return {"failure": "memory", "message": "MemoryError", "layers": layers}
    return {"failure": "error", "error_type": type(err).__name__, "message": str(err)[:2000], "layers": layers}


TUPLE = "__slimrl_tuple__"  # a session's answer keeps tuples as tuples: {TUPLE: [items]}


def _tag_tuples(value, depth: int = 0):
    if depth > 200:
        raise ValueError("nested too deep")
    if isinstance(value, tuple):
        return {TUPLE: [_tag_tuples(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return [_tag_tuples(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _tag_tuples(v, depth + 1) for k, v in value.items()}
    return value


def _call(fn, args: list, kwargs: dict, layers: list[str], tuples: bool = False) -> dict:
    """One call of the code's function (none: the code ran, its value is None), as the answer to send; ``tuples``:
    tuples tagged (a session)."""
    try:
        value = fn(*args, **kwargs) if fn is not None else None
        if tuples:
            value = _tag_tuples(value)
    except BaseException as err:  # noqa: BLE001 - the code's own failure, reported by type
        return _failure(err, layers)
    try:
        json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return {
            "failure": "result",
            "message": f"the result is not JSON data: {type(value).__name__}",
            "layers": layers,
        }
    return {"value": value, "layers": layers}


if __name__ == "__main__":
    main()
