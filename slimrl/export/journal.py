"""The swap's journal and what the next export does with a swap that was killed.

A swap (``files._swap_in``) moves the files it replaces into a backup folder beside the output and writes there a
journal: the new files, each with its size and modification time (``os.replace`` keeps both, so a placed file still
shows them). When its process is gone, the next export (:func:`clean_stale`) puts the old export back from that
folder. Another user on the same machine can plant folders of the same shape, in ``$TMPDIR`` or in a shared output
folder, so a folder is used only when it is this user's own (owned by this uid, a real folder, writable by nobody
else: ``mkdtemp`` makes it ``0700``), every path its journal names lies inside the output folder, and a file is
removed only when it is still the one the swap placed. A journal that does not read as one is set aside under
another name with one line, and nothing is deleted or restored from it."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from slimrl.compat.runtime.callsite import warn
from slimrl.compat.runtime.processes import pid_alive

STAGE_MARK = ".slimrl-staging"  # inside every staging and backup folder slimrl makes (what clean_stale removes)
NEW, PLACING, UNPLACED, DONE = ".slimrl-new.json", ".slimrl-placing", ".slimrl-unplaced", ".slimrl-done"
_MARKS = (STAGE_MARK, NEW, PLACING, UNPLACED, DONE)
# exactly the names tempfile gives (its 8 random characters last), and a staging folder only with its marker:
# a user's folder named like one (".notes.partial-999999-mine") is never touched
_TEMP = re.compile(r"^(?:slimrl-(?:merged|gguf|push)-|(\.).+\.(?:partial|backup)-)(\d+)-[a-z0-9_]{8}$")
_BACKUP = re.compile(r"^\.(.+)\.backup-\d+-[a-z0-9_]{8}$")


class JournalError(ValueError):
    """A backup folder whose journal or contents cannot be trusted: nothing is deleted or restored from it."""


def fingerprint(path: Path) -> list[int]:
    """Size and modification time: a file edited since the export wrote it differs (no hashing of gigabytes)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def own_folder(path: Path) -> bool:
    """A real folder (not a link) of this uid that no one else can write into: what slimrl's ``mkdtemp`` made."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _own_file(path: Path) -> bool:
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def inside(target: Path, rel: object) -> bool:
    """``rel`` names a path below ``target`` (relative, no ``..``, no link on the way out of it)."""
    if not isinstance(rel, str) or not rel or os.path.isabs(rel) or "\0" in rel:
        return False
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return False
    root = target.resolve()
    return (root / rel).resolve().is_relative_to(root)


def write_journal(backup: Path, stage: Path, new: set[str]) -> None:
    """The journal a killed swap is repaired from: each new file with its fingerprint before it is moved."""
    entries = {rel: fingerprint(stage / rel) for rel in sorted(new)}
    (backup / NEW).write_text(json.dumps({"files": entries}))


def read_journal(backup: Path, target: Path) -> dict[str, list[int]]:
    """The journal's new files and fingerprints; :class:`JournalError` when it is not one this code wrote."""
    if not _own_file(backup / NEW):
        raise JournalError(f"its journal {NEW} is missing or not a file of yours")
    try:
        data = json.loads((backup / NEW).read_text())
    except (OSError, ValueError) as exc:
        raise JournalError(f"its journal {NEW} does not parse ({type(exc).__name__})") from None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        raise JournalError(f"its journal {NEW} holds {type(data).__name__}, not the swap's list of files")
    for rel, mark in files.items():
        if not inside(target, rel):
            raise JournalError(f"its journal names {rel!r}, which is not inside {target}")
        if not (isinstance(mark, list) and len(mark) == 2 and all(type(v) is int for v in mark)):
            raise JournalError(f"its journal's entry for {rel!r} is not a size and a time")
    return files


def _saved(backup: Path, target: Path) -> list[str]:
    """The files the swap set aside (regular files only; a link in the backup is not followed)."""
    out = []
    for root, _dirs, files in os.walk(backup):
        for name in files:
            path = Path(root) / name
            rel = str(path.relative_to(backup))
            if rel in _MARKS:
                continue
            if not _own_file(path) or not inside(target, rel):
                raise JournalError(f"it holds {rel!r}, which is not a file the swap set aside")
            out.append(rel)
    return sorted(out)


def repair(target: Path, backup: Path) -> None:
    """Undo the swap ``backup`` journals (its process was killed): the files it placed removed, the files it set
    aside put back, so ``target`` holds the export from before; nothing when the swap had finished. Everything is
    checked (:class:`JournalError`) before anything changes."""
    if (backup / DONE).exists() or target.is_symlink() or not target.is_dir():
        return
    new = read_journal(backup, target)
    saved = _saved(backup, target)
    if (backup / PLACING).exists() and not (backup / UNPLACED).exists():  # some new files may be in
        for rel in sorted(set(new) - set(saved)):
            path = target / rel
            if _own_file(path) and fingerprint(path) == new[rel]:  # still the file the swap placed
                path.unlink()
        (backup / UNPLACED).touch()  # a repair killed from here on must not remove what it has put back
    for rel in saved:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(backup / rel, target / rel)


def _set_aside(backup: Path, target: Path, why: str) -> Path:
    aside = backup.with_name(backup.name.replace(".backup-", ".set-aside-", 1))
    os.replace(backup, aside)
    warn(
        f"slimrl export: the backup of an interrupted export into {target} was not used: {why}; it is kept as "
        f"{aside} and nothing was deleted or restored from it, so {target} may mix two exports: check it, then "
        f"remove {aside}"
    )
    return aside


def clean_stale(*folders: str | Path) -> list[Path]:
    """Remove temporary export folders left by processes that are gone (their names carry the process id), in the
    system's temporary folder and in ``folders``, repairing each killed swap from its backup first. Only this
    user's own folders are read or removed (module docstring). Returns what was removed."""
    removed = []
    for place in [Path(tempfile.gettempdir()), *map(Path, folders)]:
        if not place.is_dir():
            continue
        for path in place.iterdir():
            match = _TEMP.match(path.name)
            if not match or not own_folder(path):
                continue
            if match.group(1) and not _own_file(path / STAGE_MARK):
                continue
            pid = int(match.group(2))
            if pid == os.getpid() or pid_alive(pid):
                continue
            backup = _BACKUP.match(path.name)
            if backup:  # a swap that was killed: its target back to the old export before the backup goes
                try:
                    repair(place / backup.group(1), path)
                except (JournalError, OSError) as exc:
                    _set_aside(path, place / backup.group(1), str(exc))
                    continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
