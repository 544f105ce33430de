"""A child started with the parent-death signal from a worker thread lives as long as the process, not the thread
(``PR_SET_PDEATHSIG`` fires when the forking *thread* ends: OpenEnv servers launched from a thread died with it)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from slimrl.compat.runtime.processes import die_with_parent, spawn_for_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def _from_a_thread(start) -> subprocess.Popen:
    got = []
    worker = threading.Thread(
        target=lambda: got.append(
            start([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=die_with_parent)
        )
    )
    worker.start()
    worker.join()
    time.sleep(0.5)
    return got[0]


def test_a_child_spawned_from_a_finished_thread_keeps_running():
    child = _from_a_thread(spawn_for_process)
    try:
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_plain_popen_from_a_thread_dies_with_it():
    """The case being fixed (so the test above is not vacuous)."""
    child = _from_a_thread(subprocess.Popen)
    assert child.wait(timeout=10) is not None
