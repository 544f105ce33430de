"""The reward sandbox against hostile code, each attack with what must hold: nothing outside the scratch directory
changed, nothing of the trainer read, the call returns within its limit with a typed result, no process left.

Most attacks run twice: with the audit hook (the default) and with ``audit_hook=False``, where only the kernel layers
(namespaces, the filesystem view, Landlock, seccomp, resource limits) stand between the code and the machine — the
hook lives in the same interpreter as the code, so the kernel layers must hold on their own. Modules an attack needs
(``os``, ``ctypes``, ``socket``, ``signal``) are allowed on purpose: a reward author may allow them.
These tests need the kernel isolation (Linux with user namespaces and libseccomp: this machine and CI's, both run the
suite as root, where user namespaces are always available); elsewhere they are skipped with the reason."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from slimrl.rewards.process_sandbox import Limits, isolation_report, run_sandboxed

LIMITS = Limits(wall_s=10, cpu_s=3, memory_mb=256, disk_mb=8)
EVERYTHING = {"os", "ctypes", "socket", "signal", "json", "time", "threading", "math", "typing"}
_report = isolation_report()
pytestmark = pytest.mark.skipif(not _report["ok"], reason=f"no kernel isolation here: {_report['missing']}")
HOOK = pytest.mark.parametrize("hook", [True, False], ids=["with-hook", "kernel-only"])


def run(code: str, hook: bool, **kw):
    before = set(_sandbox_processes())  # another test's live sessions (locked-down functions) are not this call's
    started = time.perf_counter()
    got = run_sandboxed(
        code,
        call=kw.pop("call", "attack"),
        allow=kw.pop("allow", EVERYTHING),
        limits=kw.pop("limits", LIMITS),
        audit_hook=hook,
        **kw,
    )
    assert time.perf_counter() - started < LIMITS.wall_s + 5, "the call outlived its limit"
    assert not set(_sandbox_processes()) - before, "a sandbox process outlived the call"
    return got


def _sandbox_processes() -> list[int]:
    """Every sandbox process on the machine but those of a sibling of this process (another pytest-xdist worker's
    tests run their own at the same time); an escaped orphan, re-parented away from its trainer, still counts."""
    time.sleep(0.05)
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (b"_sandbox_child.py" in cmd or b"_sandbox_launch.py" in cmd) and not _under_a_sibling(int(pid)):
            left.append(int(pid))
    return left


def _under_a_sibling(pid: int) -> bool:
    me, parent = os.getpid(), os.getppid()
    if parent <= 1:  # orphans are re-parented to init: no sibling can be told from them
        return False
    while pid > 1 and pid != me:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid == parent:
            return True
        pid = ppid
    return False


@pytest.fixture
def secret(tmp_path):
    """A trainer file only root may read (0600), in a directory of the trainer's."""
    path = tmp_path / "trainer" / "secret.txt"
    path.parent.mkdir()
    path.write_text("TRAINER-SECRET")
    path.chmod(0o600)
    return path


def _value_or_failure(got) -> str:
    return repr(got.value) + repr(got.failure) + got.stdout + got.stderr


@HOOK
def test_the_rules_reassigned_from_inside_do_not_open_anything(hook, secret, tmp_path):
    """Bypass 1: the child's rules reached through an allowed module and emptied, then every escape tried."""
    out = tmp_path / "written-by-the-code"
    code = f"""
def attack():
    import typing, os
    main = typing.sys.modules['__main__']
    for name in ('FORBIDDEN', 'INTROSPECTION', 'LISTINGS'):
        setattr(main, name, ())
    main.WRITES = {{}}
    tried = {{}}
    for what, step in (('read', lambda: open({str(secret)!r}).read()),
                       ('passwd', lambda: open('/etc/passwd').read()),
                       ('write', lambda: open({str(out)!r}, 'w').write('x')),
                       ('fork', lambda: os.fork()),
                       ('kill', lambda: os.kill(os.getppid(), 9))):
        try:
            tried[what] = repr(step())
        except BaseException as e:
            tried[what] = type(e).__name__
    return tried
"""
    got = run(code, hook)
    assert "TRAINER-SECRET" not in _value_or_failure(got) and "root:" not in _value_or_failure(got)
    assert not out.exists()
    assert got.ok or got.failure.kind == "forbidden", got


@HOOK
def test_dir_fd_and_symlinks_reach_nothing_outside_scratch(hook, secret, tmp_path):
    """Bypass 2: paths resolved against a directory descriptor and through symbolic links in scratch."""
    victim = tmp_path / "trainer" / "keep.txt"
    victim.write_text("unchanged")
    code = f"""
def attack():
    import os
    got = {{}}
    for name, target in (('up', {str(secret.parent)!r}), ('root', '/')):
        try:
            os.symlink(target, name)
        except OSError as e:
            got['symlink-' + name] = type(e).__name__
    fd = os.open('.', os.O_RDONLY)
    for what, step in (('read', lambda: os.read(os.open('up/secret.txt', os.O_RDONLY, dir_fd=fd), 100)),
                       ('write', lambda: os.write(os.open('up/keep.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=fd), b'x')),
                       ('delete', lambda: os.unlink('up/keep.txt', dir_fd=fd)),
                       ('hardlink', lambda: os.link({str(secret)!r}, 'h')),
                       ('listing', lambda: os.listdir('root/'))):
        try:
            got[what] = repr(step())
        except BaseException as e:
            got[what] = type(e).__name__
    return got
"""
    got = run(code, hook)
    assert "TRAINER-SECRET" not in _value_or_failure(got)
    assert victim.read_text() == "unchanged" and secret.exists()
    assert "pytest" not in repr(got.value)  # the view holds the interpreter and libraries, nothing of ours


@HOOK
def test_a_root_only_file_is_not_readable_by_absolute_path_or_proc(hook, secret):
    code = f"""
def attack():
    out = []
    for path in ({str(secret)!r}, '/proc/self/mem', '/proc/1/environ', '/etc/shadow'):
        try:
            out.append(open(path, 'rb').read(64).decode('latin-1'))
        except BaseException as e:
            out.append(type(e).__name__)
    return out
"""
    got = run(code, hook)
    assert "TRAINER-SECRET" not in _value_or_failure(got)
    if not hook:
        assert got.ok and all(v in ("FileNotFoundError", "PermissionError") for v in got.value), got.value


@HOOK
def test_no_process_is_created_and_none_survives(hook):
    code = """
def attack():
    import os, ctypes
    out = {}
    for what, step in (('fork', os.fork), ('libc fork', lambda: ctypes.CDLL(None).fork()),
                       ('setsid', os.setsid), ('exec', lambda: os.execv('/bin/sh', ['sh']))):
        try:
            out[what] = step()
        except BaseException as e:
            out[what] = type(e).__name__
    return out
"""
    got = run(code, hook)
    if not hook:
        assert got.ok, got
        assert got.value["fork"] == "PermissionError" and got.value["libc fork"] == -1
        assert got.value["setsid"] == "PermissionError" and got.value["exec"] in (
            "PermissionError",
            "FileNotFoundError",
        )


@HOOK
def test_the_trainer_cannot_be_signalled(hook):
    seen = []
    old = signal.signal(signal.SIGUSR1, lambda *a: seen.append(1))
    try:
        code = f"""
def attack():
    import os, signal, ctypes
    out = []
    for step in (lambda: os.kill({os.getpid()}, signal.SIGUSR1), lambda: os.kill(-1, signal.SIGUSR1),
                 lambda: ctypes.CDLL(None).kill({os.getpid()}, 10)):
        try:
            out.append(step())
        except BaseException as e:
            out.append(type(e).__name__)
    return out
"""
        run(code, hook)
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert not seen


@HOOK
def test_no_socket_reaches_the_trainer(hook, tmp_path):
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(1)
    tcp.settimeout(0.1)
    unix = socket.socket(socket.AF_UNIX)
    unix_path = str(tmp_path / "trainer.sock")
    unix.bind(unix_path)
    unix.listen(1)
    unix.settimeout(0.1)
    code = f"""
def attack():
    import socket
    out = []
    for family, address in ((socket.AF_INET, ('127.0.0.1', {tcp.getsockname()[1]})),
                            (socket.AF_UNIX, {unix_path!r}), (socket.AF_UNIX, '\\0abstract')):
        try:
            s = socket.socket(family)
            s.connect(address)
            out.append('connected')
        except BaseException as e:
            out.append(type(e).__name__)
    return out
"""
    try:
        got = run(code, hook)
        for server in (tcp, unix):
            with pytest.raises(TimeoutError):
                server.accept()
    finally:
        tcp.close()
        unix.close()
    assert "connected" not in _value_or_failure(got)


@HOOK
def test_exhaustion_ends_with_a_typed_failure(hook):
    memory = run("def attack():\n    return len(bytearray(1 << 30))\n", hook)
    assert memory.failure.kind == "memory", memory
    disk = run(
        "def attack():\n    f = open('big', 'wb')\n    for _ in range(64):\n"
        "        f.write(b'x' * (1 << 20))\n    return 1\n",
        hook,
    )
    assert not disk.ok and disk.failure.kind in ("error", "crashed"), disk  # the 8 MB scratch is full, or the file
    output = run(
        "def attack():\n    while True:\n        print('x' * 100000)\n",
        hook,
        limits=Limits(wall_s=6, cpu_s=5, memory_mb=256),
    )
    assert output.failure.kind in ("forbidden", "timeout") and len(output.stdout) <= 64 * 1024, output.failure
    bomb = run(
        "def attack():\n    import threading\n    ts = [threading.Thread(target=lambda: None) for _ in "
        "range(50)]\n    [t.start() for t in ts]\n    [t.join() for t in ts]\n    return 'threads ok'\n",
        hook,
    )
    assert bomb.value == "threads ok", bomb  # threads are not processes: they stay allowed


@HOOK
def test_forged_huge_and_deep_answers_are_bad_results(hook):
    forged = run(
        "def attack():\n    import os\n    os.write(RESULT, b'{\"value\": [1, 2')\n    os._exit(0)\n".replace(
            "RESULT", "3"
        ),
        hook,
    )
    # the result descriptor's number is the trainer's; the code may guess and write there: never a trusted value
    assert not forged.ok or forged.value is None
    huge = run("def attack():\n    return 'x' * (4 << 20)\n", hook)
    assert huge.failure.kind == "result", huge
    deep = run("def attack():\n    v = []\n    for _ in range(950):\n        v = [v]\n    return v\n", hook)
    assert deep.failure.kind == "result", deep


def test_degenerate_expressions_are_typed_failures_not_exceptions():
    long_sum = "def attack():\n    return " + "+".join(["1"] * 5000) + "\n"
    minus = "def attack():\n    return " + "-" * 200000 + "1\n"
    for code in (long_sum, minus):
        got = run_sandboxed(code, call="attack", limits=LIMITS)
        assert not got.ok and got.failure.kind in ("error", "crashed"), got


def test_the_layers_are_reported():
    assert {
        "user namespace",
        "mount namespace",
        "pid namespace",
        "network namespace",
        "seccomp",
        "resource limits",
        "audit hook",
    } <= set(_report["layers"])
    got = run_sandboxed("def f():\n    return 1\n", call="f", isolation="none", limits=LIMITS)
    assert got.ok and "seccomp" not in got.isolation and "audit hook" in got.isolation


def test_a_call_in_a_thread_is_contained_too():
    results, before = [], set(_sandbox_processes())
    worker = threading.Thread(
        target=lambda: results.append(
            run_sandboxed("def f():\n    while True: pass\n", call="f", limits=Limits(wall_s=3, cpu_s=2))
        )
    )
    worker.start()
    worker.join(15)
    assert results and results[0].failure.kind == "timeout"
    assert not set(_sandbox_processes()) - before


def test_without_namespaces_it_refuses_in_one_line_and_runs_nothing(tmp_path):
    """A kernel that gives no user namespaces (here: a seccomp filter refusing ``unshare`` to the process that calls
    ``run_sandboxed``, and so to its children): a typed IsolationError naming what is missing and how to allow it,
    no code run; ``isolation="none"`` runs, by the caller's explicit choice."""
    import subprocess
    import sys

    marker = tmp_path / "ran"
    script = f"""
import ctypes
from slimrl.rewards import _sandbox_kernel as k
lib = k._libseccomp()
ctx = lib.seccomp_init(k.SCMP_ACT_ALLOW)
lib.seccomp_rule_add_array(ctx, 0x00050000 | 1, lib.seccomp_syscall_resolve_name(b"unshare"), 0, None)
assert lib.seccomp_load(ctx) == 0
from slimrl.rewards.process_sandbox import run_sandboxed
code = "def f():\\n    open({str(marker)!r}, 'w').write('x')\\n    return 1\\n"
got = run_sandboxed(code, call="f")
print(type(got.failure).__name__, "|", got.failure)
none = run_sandboxed("def f():\\n    return 2\\n", call="f", isolation="none")
print("none:", none.value)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    lines = [ln for ln in out.stdout.splitlines() if "|" in ln or ln.startswith("none:")]
    assert lines and lines[0].startswith("IsolationError |"), out.stdout + out.stderr
    assert "user namespaces" in lines[0] and "isolation='none'" in lines[0] and not marker.exists()
    assert lines[1] == "none: 2"


@HOOK
def test_a_fifo_swapped_in_for_the_channels_cannot_hang_the_trainer(hook):
    """The old runner read files in a work directory the child owned: a FIFO put in place of its stdout blocked the
    trainer for ever. The channels are the trainer's pipes now; the call ends at its limit."""
    code = (
        "def attack():\n    import os, time\n    os.mkfifo('f')\n    fd = os.open('f', os.O_RDWR)\n"
        "    for target in (0, 1, 2):\n        os.dup2(fd, target)\n    time.sleep(60)\n"
    )
    got = run(code, hook, limits=Limits(wall_s=3, cpu_s=2, memory_mb=256))
    assert not got.ok and got.failure.kind in ("timeout", "forbidden", "error"), got
