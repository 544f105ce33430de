"""The guard that keeps an OpenEnv server (and whatever it starts) from outliving the run: a server whose shutdown
hook hangs (it ignores ``SIGTERM``) and a process it started are both gone a few seconds after the run is killed
with ``SIGKILL``, and after an ordinary end (round 7: such a server outlived a killed trainer)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from slimrl.environments import openenv as launcher
from slimrl.environments.server_guard import SHUTDOWN_GRACE

HANGING_SERVER = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, lambda *a: time.sleep(600))  # a shutdown hook that hangs
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(600)
"""


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _wait_for(path: Path, starter: subprocess.Popen | None = None) -> list[int]:
    """The pids the stand-in server wrote (a patient wait: imports on a loaded machine can take a minute)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        text = path.read_text().split() if path.exists() else []
        if len(text) == 2:
            return [int(x) for x in text]
        assert starter is None or starter.poll() is None, "the process starting the server ended first"
        time.sleep(0.05)
    raise AssertionError("the server did not start")


def _all_gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(_gone(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def test_a_hanging_server_and_its_child_end_when_the_run_is_killed(tmp_path):
    pids_file = tmp_path / "pids"
    run = f"""
import sys, time
from slimrl.environments import openenv as launcher
launcher._guarded([sys.executable, "-c", {HANGING_SERVER!r}, {str(pids_file)!r}])
time.sleep(600)
"""
    trainer = subprocess.Popen([sys.executable, "-c", run])
    try:
        pids = _wait_for(pids_file, trainer)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    assert _all_gone(pids, SHUTDOWN_GRACE + 10), "the server or its child outlived the killed run"


def test_a_hanging_server_ends_with_an_ordinary_end(tmp_path):
    pids_file = tmp_path / "pids"
    guard = launcher._guarded([sys.executable, "-c", HANGING_SERVER, str(pids_file)])
    pids = _wait_for(pids_file, guard)
    launcher._end(guard)
    assert guard.poll() is not None and _all_gone(pids, SHUTDOWN_GRACE + 10)
    assert guard.returncode != -signal.SIGKILL  # the guard ended the group itself (the grace, then the kill)


def test_the_guard_passes_on_a_server_that_exits(tmp_path):
    guard = launcher._guarded([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert guard.wait(timeout=60) == 3
