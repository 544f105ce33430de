"""Kernel memory and per-user budgets a sandboxed call could take outside its limits are refused by the seccomp
filter (run without the audit hook: the kernel layers are what holds): SysV semaphores (+3 GB of slab from one call
under memory_mb=512) and message queues (+513 MB), POSIX message queues, and fanotify instances (a budget the trainer
shares: exhausting it broke the trainer's own ``fanotify_init``). Skipped where this machine gives no kernel
isolation."""

from __future__ import annotations

import pytest

from slimrl.rewards.process_sandbox import isolation_report, run_sandboxed

pytestmark = pytest.mark.skipif(not isolation_report()["ok"], reason="no kernel isolation on this machine")

LIBC = "import ctypes\ndef f():\n    libc = ctypes.CDLL(None, use_errno=True)\n"


@pytest.mark.parametrize(
    ("what", "call"),
    [
        ("SysV semaphores", "libc.semget(0, 250, 0o1600)"),
        ("SysV message queue", "libc.msgget(0, 0o1600)"),
        ("POSIX message queue", "libc.mq_open(b'/slimrl-test', 0o100 | 2, 0o600, None)"),
        ("fanotify", "libc.fanotify_init(0, 0)"),
    ],
)
def test_kernel_memory_and_user_budgets_are_refused(what, call):
    result = run_sandboxed(f"{LIBC}    return [{call}, ctypes.get_errno()]", "f", allow=["ctypes"], audit_hook=False)
    assert result.failure is None, result
    assert result.value == [-1, 1], (what, result.value)  # EPERM
