"""The self-check on a TRL slimrl's tests never ran: each trainer's tiny parity row before its patches go in.

When the installed TRL is newer than every release ``make test`` runs (:data:`slimrl.compat.trl_info.TESTED_TRL`),
or a method slimrl replaces has a signature none of those releases had (:func:`slimrl.patching.contracts.
signature_changes`), the first ``PatchFastRL(algorithm)`` of a process runs that trainer's ``slimrl verify --tiny``
row for its first loss type (TRL alone vs patched, two steps of a 2-layer random model on the CPU, in a child
process) and installs only the patches of trainers whose row passes. A trainer whose row fails runs as TRL alone:
one line names it, its patches and the row; a patch several trainers share stands down when any of them failed.
The verdicts are cached per (TRL, transformers, slimrl) version set in ``SLIMRL_CACHE`` (default
``~/.cache/slimrl``), ``self-check.json``, so each trainer is checked once per set; ``slimrl doctor`` prints them.
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

from slimrl.compat.callsite import warn
from slimrl.compat.env import env_flag

ENV = "SLIMRL_SELF_CHECK"
TIMEOUT_S = 900
_SKIP_NOTED: list[bool] = []


def cache_file() -> Path:
    return Path(os.environ.get("SLIMRL_CACHE", Path.home() / ".cache" / "slimrl")) / "self-check.json"


def version_set() -> str:
    """The key verdicts are cached under."""
    from slimrl.compat.trl_info import trl_version

    return f"trl {trl_version()}, transformers {version('transformers')}, slimrl {version('slimrl')}"


def why_check(names: list[str], patches_of) -> str | None:
    """Why ``names`` need the self-check on the installed TRL (None: it is a tested one and every replaced method
    has a recorded signature)."""
    from slimrl.compat.trl_info import newest_tested, trl_version
    from slimrl.patching.contracts import signature_changes
    from slimrl.patching.registry import is_installed

    newest, installed = newest_tested(), trl_version()
    if installed > newest:
        return f"trl {installed} is newer than the releases slimrl's tests run (newest: {newest})"
    # a patch another trainer already installed shows slimrl's signature, not TRL's: it was looked at then
    changed = signature_changes([p for n in names for p in patches_of(n) if not is_installed(p)])
    if changed:
        key = next(iter(changed))
        return f"{key} has a signature slimrl's tests never saw" + (f" (and {len(changed) - 1} more)"
                                                                      if len(changed) > 1 else "")
    return None


def cached() -> dict[str, dict[str, Any]]:
    """Every cached verdict: ``version set -> trainer -> {"passed", "row", "seconds"}``."""
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _save(key: str, verdicts: dict[str, Any]) -> None:
    data = cached()
    data.setdefault(key, {}).update(verdicts)
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
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
        print(f"slimrl: {reason}: checking {', '.join(todo)} against TRL alone on a tiny model, once for this "
              f"version set ({ENV}=0 skips)", file=sys.stderr, flush=True)
        fresh = (run or run_rows)(todo)
        _PROCESS.setdefault(key, {}).update(fresh)
        _save(key, fresh)
        known.update(fresh)
    return {n: known[n]["row"] for n in names if n in known and not known[n]["passed"]}


def run_rows(names: list[str]) -> dict[str, dict[str, Any]]:
    """Each trainer's row in a child process (``SLIMRL_SELF_CHECK=0`` there): ``trainer -> verdict``."""
    started = time.perf_counter()
    env = {**os.environ, ENV: "0", "SLIMRL_AUTOPATCH": "0"}
    code = f"from slimrl.verify.self_check_rows import child; child({names!r})"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              timeout=TIMEOUT_S)
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        out, err, rc = "", f"no answer in {TIMEOUT_S} s", -1
    verdicts = {}
    for line in out.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            verdicts[row.pop("trainer")] = row
    for name in names:  # a child that died says nothing of the trainers it did not reach
        verdicts.setdefault(name, {"passed": False, "row": f"the check itself stopped (exit {rc}): "
                                   f"{(err.strip().splitlines() or ['no output'])[-1][:200]}",
                                   "seconds": round(time.perf_counter() - started, 1)})
    return verdicts


def stand_down_line(name: str, row: str, patch_names: list[str]) -> str:
    from slimrl.compat.trl_info import trl_version

    return (f"slimrl: self-check on trl {trl_version()}: {row} -- not patched, it runs as TRL alone (stood down: "
            f"{', '.join(patch_names)})")
