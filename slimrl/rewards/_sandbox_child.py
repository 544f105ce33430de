"""The process :func:`slimrl.rewards.process_sandbox.run_sandboxed` starts: ``python -I -S <this file>``.

Standard library only (no site-packages are on its path). It reads one JSON request from stdin, closes itself in
(lower privileges, namespaces, resource limits, an audit hook), runs the code and writes one JSON answer to the
result file descriptor it was handed (``result_fd``). Every step before the code runs is the trusted part; the
order matters:

1. the allowed modules are imported (so their own dependencies are loaded while nothing is refused yet);
2. root only, where ``nobody`` can read the standard library: drop to the ``nobody`` user (the kernel then refuses
   it the trainer's processes and files not readable by all, and the process-count limit applies: root is exempt
   from it);
3. where the kernel allows unprivileged user namespaces: a new user and network namespace (no interface but a
   loopback that is down: no connection can leave the process);
4. resource limits: CPU seconds, address space, largest file written, open files, no core file, and no new process
   (``RLIMIT_NPROC`` 0);
5. the audit hook: from here on, any event in :data:`FORBIDDEN` or a file access outside the scratch directory
   (writes) or outside the scratch directory and the standard library (reads) ends the process at once with a
   ``forbidden`` answer — the code cannot catch it; frame and garbage-collector introspection
   (:data:`INTROSPECTION`) is refused with ``ValueError``;
6. the code runs with builtins whose ``__import__`` admits the allowed modules only.
"""

from __future__ import annotations

import builtins
import json
import os
import sys

RESULT_FD = -1  # the result file's descriptor, from the request
NOBODY = 65534

# audit events refused once the code runs (a prefix ends in ".")
FORBIDDEN = ("socket.", "ctypes.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
             "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill", "pty.spawn", "os.chdir", "os.chroot",
             "mmap.__new__", "resource.setrlimit", "resource.prlimit", "os.setuid",
             "marshal.load", "pickle.find_class", "sys.settrace", "sys.setprofile", "webbrowser.open",
             "urllib.Request", "http.client.connect", "ftplib.connect", "smtplib.connect", "imaplib.open",
             "poplib.connect", "telnetlib.Telnet.open", "os.startfile", "winreg.")
# introspection that would reach the runner's frames or the hook (refused with ValueError, which the standard
# library's own callers expect: namedtuple falls back when it cannot read its caller's frame)
INTROSPECTION = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe", "sys._current_frames",
                 "object.__getattr__")
# audit events whose path arguments must lie in the scratch directory
WRITES = {"os.remove": 1, "os.rmdir": 1, "os.rename": 2, "os.replace": 2, "os.mkdir": 1, "os.chmod": 1,
          "os.chown": 1, "os.link": 2, "os.symlink": 2, "os.truncate": 1, "os.utime": 1, "os.chflags": 1,
          "shutil.rmtree": 1, "shutil.copyfile": 2, "shutil.copytree": 2, "shutil.move": 2, "shutil.chown": 1}
LISTINGS = ("os.listdir", "os.scandir", "glob.glob", "os.walk")


def answer(message: dict) -> None:
    """The one answer: the result file rewritten from its start (whatever the code wrote to it is gone)."""
    data = json.dumps(message).encode()
    try:
        os.ftruncate(RESULT_FD, 0)
        os.lseek(RESULT_FD, 0, 0)
        os.write(RESULT_FD, data)
    except OSError:
        pass


def _libc_unshare(flags: int) -> bool:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(flags) == 0


def _world_readable(path: str) -> bool:
    """Whether ``nobody`` could read the standard library (every directory up to it world-searchable)."""
    path = os.path.realpath(path)
    while True:
        if not os.stat(path).st_mode & 0o005 == 0o005:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def close_in(request: dict) -> list[str]:
    """Steps 1-3 of the module docstring; returns the layers that took effect."""
    import resource

    layers = []
    if os.geteuid() == 0 and _world_readable(os.path.dirname(json.__file__)):
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            layers.append("user nobody")
        except OSError:
            pass
    try:
        if _libc_unshare(0x10000000 | 0x40000000):  # CLONE_NEWUSER | CLONE_NEWNET
            layers.append("network namespace")
    except (OSError, AttributeError):
        pass
    limits = request["limits"]
    mb = 2**20
    cpu = max(1, round(limits["cpu_s"]))
    wanted = [(resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
              (resource.RLIMIT_AS, limits["memory_mb"] * mb, limits["memory_mb"] * mb),
              (resource.RLIMIT_FSIZE, limits["file_mb"] * mb, limits["file_mb"] * mb),
              (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
              (resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_NPROC, 0, 0)]
    for which, soft, hard in wanted:
        try:
            resource.setrlimit(which, (soft, hard))
        except (OSError, ValueError):
            continue
    layers.append("resource limits")
    return layers


def _inside(path: object, roots: tuple[str, ...]) -> bool:
    if isinstance(path, int):
        return True  # an already open descriptor: its opening was checked
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return any(real == r or real.startswith(r + os.sep) for r in roots)


def install_guard(scratch: str, readable: tuple[str, ...]) -> None:
    """Step 5: the audit hook (irrevocable: Python offers no way to remove one)."""
    writable = (os.path.realpath(scratch),)
    reads = writable + tuple(os.path.realpath(r) for r in readable)

    def refuse(what: str) -> None:
        answer({"failure": "forbidden", "message": what})
        os._exit(86)

    def guard(event: str, args: tuple) -> None:
        if event.startswith(INTROSPECTION):
            raise ValueError(f"{event} is not allowed in the sandbox")
        if event.startswith(FORBIDDEN):
            refuse(f"{event} is not allowed in the sandbox")
        elif event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or \
                (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if not _inside(path, writable if writing else reads):
                refuse(f"{'writing' if writing else 'reading'} {os.fsdecode(path)!s} (outside the scratch directory)")
        elif event in WRITES:
            for path in args[:WRITES[event]]:
                if path is not None and not _inside(path, writable):
                    refuse(f"{event} on {path!s} (outside the scratch directory)")
        elif event in LISTINGS:
            if args and args[0] is not None and not _inside(args[0], reads):
                refuse(f"{event} of {args[0]!s} (outside the scratch directory)")
        elif event == "import":
            top = str(args[0]).split(".")[0]
            if top not in ALLOWED:
                refuse(f"import of {args[0]} (not an allowed module)")

    sys.addaudithook(guard)


ALLOWED: set[str] = set()


def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    """The code's ``__import__``: allowed modules only, no relative import."""
    top = name.split(".")[0]
    if level or top not in ALLOWED:
        answer({"failure": "import", "message": f"import of {name!r} (allowed: {', '.join(sorted(ALLOWED))})"})
        os._exit(87)
    return builtins.__import__(name, globals, locals, fromlist, level)


def restricted_builtins() -> dict:
    names = dict(vars(builtins))
    for name in ("breakpoint", "input", "help", "exit", "quit", "copyright", "credits", "license"):
        names.pop(name, None)
    names["__import__"] = guarded_import
    return names


def _jsonable(value):
    json.dumps(value)
    return value


def main() -> None:
    global RESULT_FD
    request = json.loads(sys.stdin.read())
    sys.stdin.close()
    RESULT_FD = request["result_fd"]
    ALLOWED.update(request["allow"])
    for module in sorted(ALLOWED | {"ctypes", "resource"}):  # loaded before the user changes (if it does)
        try:
            __import__(module)
        except ImportError:
            pass
    layers = close_in(request)
    scratch = request["scratch"]
    os.chdir(scratch)
    install_guard(scratch, tuple(request["readable"]))
    layers.append("audit hook")
    namespace = {"__builtins__": restricted_builtins(), "__name__": "__sandbox__"}
    try:
        exec(compile(request["code"], "<sandboxed code>", "exec"), namespace)  # noqa: S102 - the sandbox's job
        value = None
        if request["call"] is not None:
            fn = namespace.get(request["call"])
            if not callable(fn):
                answer({"failure": "error", "error_type": "NameError", "layers": layers,
                        "message": f"the code defines no function {request['call']!r}"})
                return
            value = fn(*request["args"], **request["kwargs"])
    except MemoryError:
        answer({"failure": "memory", "message": "MemoryError", "layers": layers})
        return
    except BaseException as err:  # the code's own failure, reported by type
        answer({"failure": "error", "error_type": type(err).__name__, "message": str(err)[:2000], "layers": layers})
        return
    try:
        answer({"value": _jsonable(value), "layers": layers})
    except (TypeError, ValueError):
        answer({"failure": "result", "message": f"the result is not JSON data: {type(value).__name__}",
                "layers": layers})


if __name__ == "__main__":
    main()
