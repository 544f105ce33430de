"""The self-check on a TRL slimrl's tests never ran: each trainer's tiny parity row before its patches go in.

When the installed TRL is newer than every release ``make test`` runs (:data:`slimrl.compat.trl_info.TESTED_TRL`), a
method slimrl replaces has a signature none of those releases had (:func:`slimrl.patching.machinery.contracts.
signature_changes`), or a method whose numbers slimrl's path re-computes has code none of them had (whatever the version
says: a fork, an editable install, a patch release; :func:`slimrl.patching.machinery.fingerprints.code_changes`), the
first ``PatchFastRL(algorithm)`` of a process runs that trainer's ``slimrl verify --tiny`` row for its first loss type
(TRL alone vs patched, two steps of a 2-layer random model on the CPU, in a child process) and installs only the patches
of trainers whose row passes. A trainer whose row fails runs as TRL alone: one line names it, its patches and the row; a
patch several trainers share stands down when any of them failed. The verdicts are cached per (TRL, transformers,
slimrl) version set and the code's fingerprints in ``SLIMRL_CACHE`` (default ``~/.cache/slimrl``), ``self-check.json``,
so each trainer is checked once per set; ``slimrl doctor`` prints them.
``SLIMRL_SELF_CHECK=0`` skips the check (every patch goes in unchecked; the line says so).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from slimrl.compat.runtime.callsite import warn
from slimrl.compat.runtime.env import env_flag

ENV = "SLIMRL_SELF_CHECK"
TIMEOUT_S = 900
_SKIP_NOTED: list[bool] = []


def cache_file() -> Path:
    return Path(os.environ.get("SLIMRL_CACHE", Path.home() / ".cache" / "slimrl")) / "self-check.json"


def version_set() -> str:
    """The key verdicts are cached under: the versions and the fingerprint of the installed code slimrl
    re-computes (a cached verdict never outlives the code it was made on)."""
    from slimrl.compat.trl_info import trl_version
    from slimrl.patching.machinery.fingerprints import digest
    from slimrl.patching.machinery.registry import patches

    return (
        f"trl {trl_version()}, transformers {version('transformers')}, slimrl {version('slimrl')}, code "
        f"{digest(patches())}"
    )


def why_check(names: list[str], patches_of) -> str | None:
    """Why ``names`` need the self-check on the installed TRL (None: it is a tested one and every replaced method
    has a recorded signature)."""
    from slimrl.compat.trl_info import newest_tested, trl_version
    from slimrl.patching.machinery.contracts import signature_changes
    from slimrl.patching.machinery.registry import is_installed

    newest, installed = newest_tested(), trl_version()
    if installed > newest:
        return f"trl {installed} is newer than the releases slimrl's tests run (newest: {newest})"
    # a patch another trainer already installed shows slimrl's signature, not TRL's: it was looked at then
    changed = signature_changes([p for n in names for p in patches_of(n) if not is_installed(p)])
    if changed:
        key = next(iter(changed))
        return f"{key} has a signature slimrl's tests never saw" + (
            f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        )
    from slimrl.patching.machinery.fingerprints import code_changes

    edited = code_changes([p for n in names for p in patches_of(n)])
    if edited:
        key = next(iter(edited))
        return (
            f"{key} has code none of slimrl's tested TRL releases had (trl {installed}: a fork, an editable "
            f"install or a patch release)" + (f" (and {len(edited) - 1} more)" if len(edited) > 1 else "")
        )
    return None


MAX_CACHE_BYTES = 1 << 20  # verdicts are a few hundred bytes per version set
_CACHE_NOTED: set[str] = set()


def _note_cache(problem: str) -> None:
    if problem not in _CACHE_NOTED:
        _CACHE_NOTED.add(problem)
        warn(f"slimrl: the self-check's cache {cache_file()} is not used: {problem}")


def _cache_problem(path: Path) -> str | None:
    """Why the cache (or its folder) cannot be trusted: another user's, writable by others, or not a regular
    file (a FIFO would hang the read, a device never ends); None: it can. A folder that is the user's own symlink
    is judged by the folder it names (a link's own mode is always rwx for all)."""
    import stat

    parent = path.parent  # one object: `where is parent` below
    for where in (parent, path):
        try:
            info = where.lstat()
            if where is parent and stat.S_ISLNK(info.st_mode) and info.st_uid == os.geteuid():
                info = where.stat()  # the user's own link to a folder: the folder it names is what is judged
        except FileNotFoundError:
            continue
        except OSError as err:
            return f"{where}: {err.strerror}"
        if where is path and not stat.S_ISREG(info.st_mode):
            return f"{where} is not a regular file (a link, FIFO or device); remove it"
        if info.st_uid != os.geteuid():
            return f"{where} belongs to another user; set SLIMRL_CACHE to a folder of your own"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (where is parent and info.st_mode & stat.S_ISVTX):
            return f"{where} is writable by others (chmod go-w it)"
        if where is path and info.st_size > MAX_CACHE_BYTES:
            return f"{where} is {info.st_size} bytes, not a verdict file; remove it"
    return None


def cached() -> dict[str, dict[str, Any]]:
    """Every cached verdict this user's cache holds: ``version set -> trainer -> {"passed", "row", "seconds"}``;
    a cache that cannot be trusted or read, or that holds something else, counts as empty (one line)."""
    path = cache_file()
    if not path.exists() and not path.is_symlink():
        return {}
    problem = _cache_problem(path)
    if problem:
        _note_cache(problem)
        return {}
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_CACHE_BYTES + 1))
    except (OSError, ValueError) as err:
        _note_cache(f"it cannot be read as verdicts ({type(err).__name__})")
        return {}
    verdicts = {}
    if isinstance(data, dict):
        for key, rows in data.items():
            if isinstance(rows, dict):
                verdicts[key] = {
                    name: row
                    for name, row in rows.items()
                    if isinstance(row, dict) and type(row.get("passed")) is bool and isinstance(row.get("row", ""), str)
                }
    if data and not any(verdicts.values()):
        _note_cache("it holds no verdict of the form slimrl writes")
    return verdicts


def _save(key: str, verdicts: dict[str, Any]) -> None:
    import tempfile

    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        problem = _cache_problem(path)
        if problem:
            _note_cache(problem)
            return
        data = cached()
        data.setdefault(key, {}).update(verdicts)
        fd, tmp = tempfile.mkstemp(prefix=".self-check.", suffix=".tmp", dir=path.parent)  # O_EXCL, unpredictable
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError as err:  # a read-only home: the verdict holds for this process only
        warn(f"slimrl: the self-check's verdicts could not be cached ({err}); they hold for this process only")


_PROCESS: dict[str, dict[str, Any]] = {}
_SUSPENDED: list[bool] = []


@contextlib.contextmanager
def suspended():
    """No self-check inside: ``slimrl verify``'s own runs (it is the check)."""
    _SUSPENDED.append(True)
    try:
        yield
    finally:
        _SUSPENDED.pop()


def failures(names: list[str], patches_of, checkable, run=None) -> dict[str, str]:
    """``trainer -> the failed row`` for the trainers of ``names`` whose self-check fails (empty where no check is
    needed, or ``SLIMRL_SELF_CHECK=0``). ``checkable(name)``: whether the trainer has a verify row (the others,
    checks and guards only, go in). ``run(names) -> verdicts`` replaces the child process (tests)."""

    if _SUSPENDED:
        return {}
    reason = why_check(names, patches_of)
    if reason is None:
        return {}
    if not env_flag(ENV, default=True):
        if not _SKIP_NOTED:
            _SKIP_NOTED.append(True)
            warn(f"slimrl: {reason}; the self-check is off ({ENV}=0): every patch goes in unchecked")
        return {}
    key = version_set()
    known = {**cached().get(key, {}), **_PROCESS.get(key, {})}
    todo = [n for n in names if n not in known and checkable(n)]
    if todo:
        print(
            f"slimrl: {reason}: checking {', '.join(todo)} against TRL alone on a tiny model, once for this "
            f"version set ({ENV}=0 skips)",
            file=sys.stderr,
            flush=True,
        )
        fresh = (run or run_rows)(todo)
        _PROCESS.setdefault(key, {}).update(fresh)
        _save(key, fresh)
        known.update(fresh)
    return {n: known[n]["row"] for n in names if n in known and not known[n]["passed"]}


def run_rows(names: list[str]) -> dict[str, dict[str, Any]]:
    """Each trainer's row in a child process (``SLIMRL_SELF_CHECK=0`` there): ``trainer -> verdict``."""
    import trl

    started = time.perf_counter()
    ours = str(Path(trl.__file__).resolve())
    root = str(Path(ours).parents[1])  # this process's TRL first in the child too (a script may put its own first)
    env = {
        **os.environ,
        ENV: "0",
        "SLIMRL_AUTOPATCH": "0",
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    }
    # the rows through slimrl's command line (verify sits above patching: no import of it from here)
    command = [sys.executable, "-m", "slimrl", "verify", "--self-check-rows", ",".join(names)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        out, err, rc = "", f"no answer in {TIMEOUT_S} s", -1
    verdicts = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            if "trl_file" in row:
                if row["trl_file"] != ours:  # the check would be of another TRL: none of its rows count
                    rc, err = -1, f"the check imported another TRL ({row['trl_file']}) than this process's ({ours})"
                    break
                continue
            verdicts[row.pop("trainer")] = row
    for name in names:  # a child that died says nothing of the trainers it did not reach
        verdicts.setdefault(
            name,
            {
                "passed": False,
                "row": f"the check itself stopped (exit {rc}): {(err.strip().splitlines() or ['no output'])[-1][:200]}",
                "seconds": round(time.perf_counter() - started, 1),
            },
        )
    return verdicts


def stand_down_line(name: str, row: str, patch_names: list[str]) -> str:
    from slimrl.compat.trl_info import trl_version

    return (
        f"slimrl: self-check on trl {trl_version()}: {row} -- not patched, it runs as TRL alone (stood down: "
        f"{', '.join(patch_names)})"
    )
