"""Whether a process is still running (lock files and temporary folders name the process that made them)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` exists (also when it belongs to another user: signalling it is then refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
