"""Processes: whether one is still running (lock files and temporary folders name the process that made them), and
children that end with this process."""

from __future__ import annotations

import os
from typing import Any


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists (also when it belongs to another user: signalling it is then refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def descendants(pid: int) -> set[int]:
    """The process ids below ``pid`` (``/proc/<pid>/task/*/children``; empty where /proc does not say)."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as f:
                    kids = {int(x) for x in f.read().split()}
            except (OSError, ValueError):
                continue
            todo += list(kids - found)
            found |= kids
    return found


def reaps_orphans() -> bool:
    """Whether orphaned processes below this one are re-parented to it: it is PID 1 (a container without an init)
    or a child subreaper (``prctl(PR_GET_CHILD_SUBREAPER)``)."""
    if os.getpid() == 1:
        return True
    try:
        import ctypes

        flag = ctypes.c_int(0)
        ctypes.CDLL(None, use_errno=True).prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
        return bool(flag.value)
    except (OSError, AttributeError):
        return False


def die_with_parent(signum: int | None = None) -> None:
    """In a child process before exec (``subprocess``'s ``preexec_fn``): the kernel sends it ``signum`` (SIGKILL by
    default) when its parent dies, so a killed parent leaves no child running (Linux; elsewhere nothing)."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signum or signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_SPAWNER: list = []  # one thread for the process's whole life, started on first use


def spawn_for_process(*args: Any, **kwargs: Any) -> Any:
    """``subprocess.Popen(*args, **kwargs)`` made from a thread that lives as long as this process. The kernel's
    parent-death signal (:func:`die_with_parent`) fires when the *thread* that forked the child ends, so a server
    started from a worker thread (a notebook's background cell, a thread pool) would die with that thread; forked
    from this thread, it ends with the process instead."""
    import concurrent.futures
    import subprocess

    if not _SPAWNER:
        _SPAWNER.append(concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="slimrl-spawner"))
    return _SPAWNER[0].submit(subprocess.Popen, *args, **kwargs).result()
