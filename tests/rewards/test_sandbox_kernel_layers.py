"""Adversarial cases against the kernel-isolated sandbox, each contained (run without the audit
hook: the kernel layers are what holds). Skipped where this machine gives no kernel isolation."""

from __future__ import annotations

import pytest

from slimrl.rewards.process_sandbox import isolation_report, run_sandboxed
from slimrl.rewards.sandbox_types import Limits

pytestmark = pytest.mark.skipif(not isolation_report()["ok"], reason="no kernel isolation on this machine")


def _run(code: str, allow: list[str], **kwargs):
    result = run_sandboxed(code, "f", allow=allow, audit_hook=False, **kwargs)
    assert result.failure is None, result
    return result.value


def test_threads_are_capped_per_call():
    """2,991 threads once took the trainer's PIDs; now a call has at most 64 tasks (RLIMIT_NPROC, counted in the
    call's own user namespace), small stacks or not."""
    code = (
        "import threading, time\ndef f():\n    threading.stack_size(65536)\n    n = 0\n    try:\n"
        "        for _ in range(3000):\n            threading.Thread(target=time.sleep, args=(2,)).start()\n"
        "            n += 1\n    except RuntimeError:\n        pass\n    return n"
    )
    started = _run(code, ["threading", "time"], limits=Limits(wall_s=30))
    assert 0 < started < 64


def test_the_parent_death_signal_cannot_be_cleared():
    """A process that cleared PR_SET_PDEATHSIG outlived the trainer's SIGKILL; the filter refuses the change."""
    code = (
        "import ctypes\ndef f():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    return [libc.prctl(1, 0, 0, 0, 0), ctypes.get_errno()]"
    )
    assert _run(code, ["ctypes"]) == [-1, 1]  # EPERM


@pytest.mark.parametrize(
    ("what", "code"),
    [
        (
            "memfd",
            "import os\ndef f():\n    try:\n        os.memfd_create('x')\n        return 'made'\n"
            "    except OSError as e:\n        return e.errno",
        ),
        (
            "sysv shm",
            "import ctypes\ndef f():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
            "    return libc.shmget(0, 1 << 20, 0o1600) == -1 and ctypes.get_errno()",
        ),
        (
            "inotify",
            "import ctypes\ndef f():\n    libc = ctypes.CDLL(None, use_errno=True)\n"
            "    return libc.inotify_init() == -1 and ctypes.get_errno()",
        ),
    ],
)
def test_memory_and_instances_outside_the_limits_are_refused(what, code):
    """SysV shared memory and memfd grew the host's Shmem by gigabytes under memory_mb=512; inotify instances are
    the user's 128 in all (the trainer's too)."""
    assert _run(code, ["os", "ctypes"]) == 1, what  # EPERM


def test_the_scratch_caps_its_inodes():
    """A flood of empty files took 220 MB of kernel memory outside disk_mb; the scratch holds at most 16,384."""
    code = (
        "import os\ndef f():\n    n = 0\n    try:\n        for i in range(40000):\n"
        "            open(str(i), 'w').close()\n            n += 1\n    except OSError:\n        pass\n"
        "    return n"
    )
    assert _run(code, ["os"], limits=Limits(wall_s=60, cpu_s=30)) < 16384


def test_a_session_computes_nothing_between_calls():
    """A session's background thread advanced a counter by 75 M steps across calls of < 1 s each; the session is
    frozen between calls now (its time limit is per call, so its CPU use must be too)."""
    import time

    from slimrl.rewards.session import SandboxSession

    code = (
        "import threading\ncount = [0]\ndef spin():\n    while True:\n        count[0] += 1\n"
        "threading.Thread(target=spin, daemon=True).start()\ndef f():\n    return count[0]"
    )
    with SandboxSession(code, "f", allow=["threading"], limits=Limits(wall_s=10, cpu_s=10)) as session:
        first = session.call().value
        time.sleep(1.0)
        second = session.call().value
    assert first is not None and second is not None
    assert second - first < 2_000_000, f"the thread ran between calls: {second - first} steps"  # ~30 M/s unfrozen


def test_timed_out_calls_leave_no_zombies_under_a_reaper(tmp_path):
    """With the trainer as PID 1 of a container (no init), five timed-out calls left seven zombies: the launcher's
    children are re-parented to the trainer when it dies. A subreaper stands for PID 1 here (the kernel re-parents
    to it the same way); slimrl reaps those processes by their ids."""
    import subprocess
    import sys

    script = """
import ctypes, os
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans below come to this process, as to PID 1
from slimrl.rewards.process_sandbox import run_sandboxed
from slimrl.rewards.sandbox_types import Limits
for _ in range(3):
    r = run_sandboxed("def f():\\n    while True:\\n        pass", "f", limits=Limits(wall_s=1, cpu_s=30))
    assert r.failure is not None and "wall-clock" in str(r.failure), r
zombies = []
for task in os.listdir(f"/proc/{os.getpid()}/task"):
    for pid in open(f"/proc/{os.getpid()}/task/{task}/children").read().split():
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
            zombies.append(pid)
print("zombies", len(zombies))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "zombies 0" in out.stdout, out.stdout
