"""The kernel calls the reward sandbox is built from (standard library and ``ctypes`` only: the launcher and the child
run under ``python -I -S``): namespaces, mounts, ``pivot_root``, Landlock, and a seccomp filter through libseccomp.

Each function raises ``OSError`` naming the call that failed; the launcher turns that into one line for the user.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_THREAD = 0x00010000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYSCALLS = {
    "x86_64": {
        "pivot_root": 155,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
    "aarch64": {
        "pivot_root": 41,
        "landlock_create_ruleset": 444,
        "landlock_add_rule": 445,
        "landlock_restrict_self": 446,
    },
}

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(name: str, *args) -> int:
    table = SYSCALLS.get(platform.machine())
    if table is None:
        raise OSError(38, f"{name}: no syscall table for {platform.machine()}")
    return _check(_libc.syscall(table[name], *args), name)


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def sethostname(name: str) -> None:
    _check(_libc.sethostname(name.encode(), len(name)), "sethostname")


def prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731 - four arguments, one rule
    _check(
        _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {source or fstype} on {target}",
    )


def umount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    _syscall("pivot_root", new_root.encode(), put_old.encode())


def locked_flags(path: str) -> int:
    """The flags a read-only remount of the bind at ``path`` must keep (a user namespace may not clear them)."""
    f = os.statvfs(path).f_flag
    flags = MS_NOSUID | MS_NODEV
    for st, ms in (
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    ):
        if f & st:
            flags |= ms
    return flags


# Landlock (the second filesystem layer): read and execute under /, write only under the scratch directory.
LANDLOCK_READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read dir
LANDLOCK_ALL = (1 << 16) - 1  # every filesystem right up to ABI 5's ioctl_dev (a lower ABI is masked below)
_ABI_RIGHTS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
LANDLOCK_SCOPE = 0x1 | 0x2  # ABI 6: abstract Unix sockets and signals reach only this sandbox's own processes


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """Landlock's ABI version, 0 when the kernel has none."""
    try:
        return max(0, _libc.syscall(SYSCALLS[platform.machine()]["landlock_create_ruleset"], None, 0, 1))
    except KeyError:
        return 0


def landlock(read_only: list[str], writable: list[str]) -> None:
    """Restrict this process and its descendants: ``read_only`` paths readable (and executable), ``writable`` ones
    fully usable, nothing else. Needs ``no_new_privs`` set."""
    abi = landlock_abi()
    if abi < 1:
        raise OSError(38, "landlock: not in this kernel")
    handled = LANDLOCK_ALL & _ABI_RIGHTS.get(abi, LANDLOCK_ALL)
    attr = _RulesetAttr(handled, 0, LANDLOCK_SCOPE if abi >= 6 else 0)
    size = ctypes.sizeof(attr) if abi >= 6 else 8  # older kernels know the first field only
    ruleset = _syscall("landlock_create_ruleset", ctypes.byref(attr), size, 0)
    try:
        for paths, rights in ((read_only, LANDLOCK_READ), (writable, handled)):
            for path in paths:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                try:
                    rule = _PathBeneath(rights & handled, fd)
                    _syscall("landlock_add_rule", ruleset, 1, ctypes.byref(rule), 0)
                finally:
                    os.close(fd)
        _syscall("landlock_restrict_self", ruleset, 0)
    finally:
        os.close(ruleset)


# seccomp through libseccomp (it writes the BPF program for this architecture and checks the architecture itself)
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_NE, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 1, 4, 7
PR_SET_PDEATHSIG = 1
EPERM, ENOSYS = 1, 38
DENIED = (  # refused with EPERM: other processes, the network, the kernel's own surfaces, namespaces, mounts
    "fork",
    "vfork",
    "execve",
    "execveat",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kill",
    "tkill",
    "rt_sigqueueinfo",
    "rt_tgsigqueueinfo",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fspick",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kcmp",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "iopl",
    "ioperm",
    "acct",
    "syslog",
    "name_to_handle_at",
    "open_by_handle_at",
    "setsid",
    "setpgid",
    "personality",
    "quotactl",
    "lookup_dcookie",
    "memfd_secret",
    "process_madvise",
    "mknod",
    "mknodat",
    # memory outside every limit: SysV shared memory and memfd pages are the host's until the call ends (RLIMIT_AS
    # counts only what is mapped); SysV semaphore sets and message queues and POSIX message queues are kernel memory
    # (gigabytes of slab from one call under memory_mb=512); inotify and fanotify instances are the user's (a budget
    # the trainer shares: exhausting it made the trainer's own fanotify_init fail)
    "shmget",
    "shmat",
    "memfd_create",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "mq_open",
    "mq_timedsend",
    "inotify_init",
    "inotify_init1",
    "fanotify_init",
    "fanotify_mark",
)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _libseccomp():
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise OSError(2, f"seccomp: libseccomp is not installed ({exc})") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def seccomp_available() -> bool:
    try:
        _libseccomp()
    except OSError:
        return False
    return True


def seccomp(own_pid: int) -> None:
    """Load the filter: :data:`DENIED` refused with EPERM; ``clone`` only for threads (``CLONE_THREAD``; a new
    process is EPERM); ``clone3`` ENOSYS (glibc then uses ``clone``); ``tgkill`` only to this process."""
    lib = _libseccomp()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError(12, "seccomp_init failed")
    errno_action = lambda e: 0x00050000 | e  # noqa: E731 - SCMP_ACT_ERRNO(e)
    try:

        def rule(name: str, action: int, *cmps: _ArgCmp) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                return  # not on this architecture
            arr = (_ArgCmp * len(cmps))(*cmps) if cmps else None
            _check(lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), arr), f"seccomp rule {name}")

        for name in DENIED:
            rule(name, errno_action(EPERM))
        rule("clone", errno_action(EPERM), _ArgCmp(0, SCMP_CMP_MASKED_EQ, CLONE_THREAD, 0))
        rule("clone3", errno_action(ENOSYS))
        rule("tgkill", errno_action(EPERM), _ArgCmp(0, SCMP_CMP_NE, own_pid, 0))
        # the parent-death signal the launcher set is what ends the code with the trainer: it may not be cleared
        rule("prctl", errno_action(EPERM), _ArgCmp(0, SCMP_CMP_EQ, PR_SET_PDEATHSIG, 0))
        _check(lib.seccomp_load(ctx), "seccomp_load")
    finally:
        lib.seccomp_release(ctx)
