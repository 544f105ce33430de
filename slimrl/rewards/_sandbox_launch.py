"""The reward sandbox's launcher: ``python -I -S _sandbox_launch.py CONFIG`` (trusted; standard library only).

It builds the isolation before any untrusted byte runs, then execs the child (``_sandbox_child.py``), which reads
the code from stdin. Three processes:

* L (this process, in the trainer's namespaces): dies with the trainer (``PR_SET_PDEATHSIG``); forks C, writes C's
  user-id maps from outside (so the child can be a user the kernel treats as unprivileged: ``nobody`` when the
  trainer is root, the trainer's own user otherwise), waits for C and exits with its status.
* C: ``unshare`` of the user, mount, PID, network, IPC and UTS namespaces; forks G (PID 1 of the new PID namespace:
  when it ends, the kernel ends every process left in it) and passes G's status on.
* G: builds the filesystem view on a fresh tmpfs root — the interpreter, its standard library and the system
  libraries bound read-only, ``/dev/null``/``zero``/``urandom``, the sandbox's own scripts, a tmpfs scratch of
  ``disk_mb`` as the only writable place, no ``/proc`` — pivots into it and detaches the old root; then drops every
  supplementary group and becomes uid/gid 1000 inside (``nobody`` or the trainer's user outside), sets
  ``no_new_privs``, adds Landlock (read-only everywhere, writable scratch; signals scoped) where the kernel has it,
  and execs the interpreter, which keeps no capability. The child then loads the seccomp filter and the resource
  limits before it reads the code.

A setup step that fails writes ``{"failure": "isolation", "message": ...}`` to the result descriptor and exits
with status 70; nothing of the code has run then.
"""

from __future__ import annotations

import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sandbox_kernel as k  # noqa: E402 - the launcher runs isolated (-I): its own folder is added by hand

INSIDE_ID = 1000
NOBODY = 65534
SETUP_FAILED = 70
SCRATCH_INODES = 16384  # files in the scratch: each inode is kernel memory outside disk_mb (about 1 kB with its entry)


RESULT_FD = [-1]  # the result pipe's descriptor, from the configuration


STEP = ["starting", ""]  # what the launcher was doing, and on which path: named when a step fails


def step(what: str, path: str) -> None:
    STEP[:] = [what, path]


def fail(message: str, own_remedy: bool = False) -> None:
    """Report a setup failure to the trainer (``own_remedy``: the message says what to do; the trainer adds no
    advice about namespaces and libseccomp)."""
    answer = {"failure": "isolation", "message": message, **({"error_type": "view"} if own_remedy else {})}
    data = json.dumps(answer).encode()
    try:
        os.write(RESULT_FD[0], len(data).to_bytes(8, "big") + data)  # framed, as the child's answers
    except OSError:
        pass
    os._exit(SETUP_FAILED)


def id_map(outside: int) -> str:
    """C's user (or group) map. Started by root: inside 0 is root (the view is built as it: files on the new tmpfs
    need a mapped owner) and inside 1000 is ``nobody``, the user the code runs as. Started by a user: inside 1000 is
    that user, the only mapping an unprivileged process may write."""
    return f"0 0 1\n{INSIDE_ID} {NOBODY} 1\n" if os.geteuid() == 0 else f"{INSIDE_ID} {outside} 1\n"


def status_code(status: int) -> int:
    """A waited-for child's status as an exit code (128 + the signal that ended it)."""
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _bind(src: str, root: str, at: str | None = None) -> None:
    """``src`` at the same path under ``root`` (or at ``at``), read-only (a symbolic link is copied as a link)."""
    dst = root + (at or src)
    os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
    if os.path.islink(src):
        if not os.path.lexists(dst):
            os.symlink(os.readlink(src), dst)
        return
    if os.path.isdir(src):
        os.makedirs(dst, mode=0o755, exist_ok=True)
    elif not os.path.exists(dst):
        open(dst, "wb").close()  # noqa: SIM115 - a mount point
    k.mount(src, dst, None, k.MS_BIND)
    k.mount(None, dst, None, k.MS_REMOUNT | k.MS_BIND | k.MS_RDONLY | k.locked_flags(dst))


def build_view(cfg: dict) -> None:
    """G's filesystem view (module docstring), then pivot into it."""
    root = cfg["root"]
    step("a private mount namespace", "/")
    k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)  # nothing of ours propagates back to the trainer's view
    step("the view's root (a tmpfs)", root)
    k.mount("tmpfs", root, "tmpfs", k.MS_NOSUID | k.MS_NODEV, "size=4m,mode=0755")
    for path in cfg["read_only"]:
        if os.path.lexists(path):
            step("binding read-only", path)
            _bind(path, root)
    step("binding slimrl's sandbox scripts", cfg["scripts"])
    _bind(cfg["scripts"], root, "/sandbox")
    step("the device files", "/dev")
    for dev in ("null", "zero", "urandom", "random"):
        dst = f"{root}/dev/{dev}"
        os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
        open(dst, "wb").close()  # noqa: SIM115 - a mount point
        k.mount(f"/dev/{dev}", dst, None, k.MS_BIND)
    step("the scratch directory", cfg["scratch"])
    os.makedirs(root + cfg["scratch"], mode=0o755)
    k.mount(
        "tmpfs",
        root + cfg["scratch"],
        "tmpfs",
        k.MS_NOSUID | k.MS_NODEV,
        f"size={cfg['disk_mb']}m,nr_inodes={SCRATCH_INODES},mode=0700,uid={INSIDE_ID},gid={INSIDE_ID}",
    )
    step("/tmp", "/tmp")
    os.makedirs(root + "/tmp", mode=0o755, exist_ok=True)  # holds bound paths where the interpreter lives there
    if cfg["tmp_mount"]:
        k.mount("tmpfs", root + "/tmp", "tmpfs", k.MS_NOSUID | k.MS_NODEV | k.MS_RDONLY, "size=4k,mode=0755")
    old = cfg["old_root"]
    step("the switch to the new root", old)
    os.makedirs(root + old, mode=0o700)
    k.pivot_root(root, root + old)
    os.chdir("/")
    k.umount(old)
    os.rmdir(old)
    k.mount(None, "/", None, k.MS_REMOUNT | k.MS_RDONLY | k.MS_NOSUID | k.MS_NODEV)


def become_child(cfg: dict) -> None:
    """G after the view: an unprivileged user, no new privileges, Landlock, then exec the child."""
    if cfg["drop_groups"]:  # started by root: its supplementary groups (root's) go; a user's own ones cannot
        os.setgroups([])
    os.setresgid(INSIDE_ID, INSIDE_ID, INSIDE_ID)
    os.setresuid(INSIDE_ID, INSIDE_ID, INSIDE_ID)  # from root inside: the kernel clears every capability
    k.prctl(k.PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of user clears it: set again, it survives the exec
    k.prctl(k.PR_SET_NO_NEW_PRIVS, 1)
    layers = ["user namespace", "mount namespace", "pid namespace", "network namespace", "ipc namespace"]
    if cfg["landlock"] and k.landlock_abi() >= 1:
        k.landlock(["/"], [cfg["scratch"]])
        layers.append("landlock")
    os.chdir(cfg["scratch"])
    env = {
        "PATH": "",
        "HOME": cfg["scratch"],
        "TMPDIR": cfg["scratch"],
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "SLIMRL_SANDBOX_LAYERS": ",".join(layers),
    }
    os.execve(cfg["python"], [cfg["python"], "-I", "-S", cfg["child"]], env)


def setup_failure(exc: Exception) -> str:
    """The step that failed, on which path, and why; then what would allow it — a remedy only for the causes the
    machine's settings decide (a permission, a missing kernel feature), never for an error of the view itself."""
    what, path = STEP
    cause = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, FileExistsError):
        hint = (
            "a path of the view collides with one slimrl bound into it: a bug of slimrl's sandbox, please report "
            "it with this line"
        )
    elif isinstance(exc, PermissionError):
        hint = "this process may not do that here: run as root, or allow unprivileged user namespaces"
    else:
        hint = "report it to slimrl with this line"
    return f"the sandbox could not be built: {what} ({path}) failed with {cause}; {hint}"


def in_namespaces(cfg: dict, go_read: int) -> None:
    """C: wait for L's maps, fork G (PID 1 inside), pass its status on."""
    os.read(go_read, 1)
    os.close(go_read)
    pid = os.fork()
    if pid == 0:
        try:
            k.prctl(k.PR_SET_PDEATHSIG, signal.SIGKILL)
            k.sethostname("sandbox")
            build_view(cfg)
            become_child(cfg)
        except Exception as exc:  # noqa: BLE001 - any setup failure is reported, nothing of the code ran
            fail(setup_failure(exc), own_remedy=True)
        os._exit(SETUP_FAILED)
    _, status = os.waitpid(pid, 0)
    os._exit(status_code(status))


def main() -> None:
    cfg = json.loads(sys.argv[1])
    RESULT_FD[0] = cfg["result_fd"]
    try:
        k.prctl(k.PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError as exc:
        fail(str(exc))
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        try:
            k.prctl(k.PR_SET_PDEATHSIG, signal.SIGKILL)
            k.unshare(
                k.CLONE_NEWUSER | k.CLONE_NEWNS | k.CLONE_NEWPID | k.CLONE_NEWNET | k.CLONE_NEWIPC | k.CLONE_NEWUTS
            )
        except OSError as exc:
            fail(f"{exc}: the kernel gives this process no user namespaces")
        os.write(ready_w, b"1")
        in_namespaces(cfg, go_r)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"1":
        try:
            with open(f"/proc/{pid}/uid_map", "w") as fh:
                fh.write(id_map(os.geteuid()))
            if os.geteuid() != 0:  # an unprivileged writer must give up setgroups before writing the group map
                with open(f"/proc/{pid}/setgroups", "w") as fh:
                    fh.write("deny")
            with open(f"/proc/{pid}/gid_map", "w") as fh:
                fh.write(id_map(os.getegid() if os.geteuid() else 0))
        except OSError as exc:
            os.kill(pid, signal.SIGKILL)
            fail(f"writing the sandbox's user map failed: {exc}")
        os.write(go_w, b"1")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    os._exit(status_code(status))


if __name__ == "__main__":
    main()
