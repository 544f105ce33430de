"""A small parent for a server process, so that the server ends with the run however the run ends.

Run by path (``python server_guard.py GRACE -- command...``, standard library only: no slimrl or torch import, so it
starts in milliseconds). It starts ``command`` in a process group (a session) of its own and waits. When the run
that started it ends — it exits, or is killed with ``SIGKILL`` and the kernel sends this guard ``SIGTERM``
(``PR_SET_PDEATHSIG``, set by the launcher) — the guard sends the server's whole group ``SIGTERM``, gives its
shutdown hooks ``GRACE`` seconds, then sends the group ``SIGKILL``: a hook that hangs, or a process the server
started, outlives neither the run nor the guard. Should the guard itself be killed, the kernel kills the server
(its own parent-death signal). The guard exits with the server's exit status when the server ends first."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

SHUTDOWN_GRACE = 5.0  # seconds a server's shutdown hooks get before its process group is killed


def command(server: list[str], grace: float = SHUTDOWN_GRACE) -> list[str]:
    """The command line that runs ``server`` under this guard (the server's arguments last, as given)."""
    return [sys.executable, os.path.abspath(__file__), str(grace), "--", *server]


def _kill_with_guard() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _end_group(child: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the server's group, SIGKILL to what is left after ``grace`` seconds (or at once once the server
    itself has gone, for what it left behind)."""
    if child.poll() is None and _signal_group(child.pid, signal.SIGTERM):
        try:
            child.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(child.pid, signal.SIGKILL)
    child.wait()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: server_guard.py GRACE -- command...", file=sys.stderr)
        return 2
    grace, server = float(argv[0]), argv[2:]
    parent = os.getppid()
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the run, which ends this guard as it exits
    child = subprocess.Popen(server, start_new_session=True, preexec_fn=_kill_with_guard)
    while not stop and child.poll() is None and os.getppid() == parent:  # a parent gone before its signal was set
        time.sleep(0.1)
    status = child.poll()
    _end_group(child, grace)
    if status is None:
        return 0
    return status if status >= 0 else 128 - status  # killed by a signal: the shell's convention


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
