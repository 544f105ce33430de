"""What the sandbox's filesystem view holds, computed in the trainer: the interpreter to run, the read-only paths
(the interpreter, its standard library, the system libraries; the sandbox's own scripts at ``/sandbox``) and the
launcher's configuration."""

from __future__ import annotations

import dataclasses
import os
import sys
import sysconfig
from pathlib import Path

SCRIPTS = "/sandbox"  # where the view shows the sandbox's own scripts (the child and the kernel calls)
SYSTEM_LIBS = ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32", "/etc/ld.so.cache")


def interpreter() -> str:
    """The real interpreter binary (a virtual environment's base Python: the child runs with ``-I -S``, no
    site-packages, so the environment adds nothing it could use)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def readable_roots() -> list[str]:
    """The standard library's directories (pure and compiled modules): what an allowed module may read."""
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], str(Path(paths["stdlib"]) / "lib-dynload")}
    return sorted(os.path.realpath(r) for r in roots if r and os.path.isdir(r))


def read_only_paths() -> list[str]:
    """Every path bound read-only into the view, outermost first, none inside another."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    wanted = {interpreter(), *readable_roots(), *SYSTEM_LIBS}
    if libdir and os.path.isdir(libdir):
        wanted.add(os.path.realpath(libdir))
    kept: list[str] = []
    for path in sorted(wanted, key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _under(path: str, point: str) -> bool:
    return path == point or path.startswith(point.rstrip("/") + "/") or point.startswith(path.rstrip("/") + "/")


def free_point(wanted: str, bound: list[str]) -> str:
    """``wanted`` as a mount point of the view's own (scratch, the old root) unless a bound path lies under it or
    above it — a slimrl, a virtual environment or an interpreter under ``/scratch``, say: then the first free
    ``/.slimrl-<name>-N``. A mount there would hide the bound files, or the bound directory would already be there."""
    if not any(_under(path, wanted) for path in bound):
        return wanted
    n = 0
    while any(_under(path, f"/.slimrl-{wanted.strip('/')}-{n}") for path in bound):
        n += 1
    return f"/.slimrl-{wanted.strip('/')}-{n}"


def launcher_config(root: Path, child: Path, limits, result_fd: int) -> dict:
    """The JSON the launcher (``_sandbox_launch.py``) takes. The view's own mount points are chosen so that no
    bound path falls under one (:func:`free_point`); ``/tmp`` gets its empty read-only tmpfs only where nothing
    bound lives there (else the bound paths are all it shows, read-only)."""
    bound = [*read_only_paths(), SCRIPTS]
    return {
        "root": str(root),
        "read_only": bound[:-1],
        "python": interpreter(),
        "scripts": str(child.parent.resolve()),
        "child": f"{SCRIPTS}/{child.name}",
        "disk_mb": limits.disk_mb,
        "result_fd": result_fd,
        "landlock": True,
        "drop_groups": os.geteuid() == 0,
        "scratch": free_point("/scratch", bound),
        "old_root": free_point("/.old", bound),
        "tmp_mount": not any(_under(path, "/tmp") for path in bound),
        "limits": dataclasses.asdict(limits),
    }
