"""``slimrl compare``'s side workers end with it: a compare killed with SIGKILL or SIGTERM left its worker running
(on a GPU, holding the memory the next run needs). Linux only (``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state in ("Z", "X")  # a zombie waits only for its reaper: it runs nothing and holds no memory


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_compare_leaves_no_worker(tmp_path, signum):
    pidfile = tmp_path / "worker.pid"
    worker = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    code = (
        f"import sys; from slimrl.cli.compare import run_sides; "
        f"run_sides(['trl'], lambda side: [sys.executable, '-c', {worker!r}], 300)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text()):
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.1)
        pid = int(pidfile.read_text())
        os.kill(parent.pid, signum)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 10
        while not _gone(pid):
            assert time.monotonic() < deadline, "the worker outlived the compare that started it"
            time.sleep(0.1)
    finally:
        if parent.poll() is None:
            parent.kill()
