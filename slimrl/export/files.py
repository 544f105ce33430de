"""Writing exports so that a failure never leaves a partial file under a final name, and an export never hides or
replaces a file it does not own.

Every export directory gets a manifest (:data:`MANIFEST`) listing the files the last export wrote there. The next
export into it removes those of them it does not write again (a sharded save after a single-file one: the old
``model.safetensors`` would otherwise shadow the new shards when transformers loads the folder) and nothing else;
a file of the same name it does not own (a user's ``README.md``, an adapter saved by hand) is refused in one line,
before anything is written, unless ``overwrite=True`` (``slimrl export --overwrite``). So are weight files of
another save the new export would sit beside. Temporary folders carry the process id in their name; a folder left by
a process that no longer exists (an export killed with ``kill -9``) is removed, its swap repaired first, by the next
export (:mod:`slimrl.export.journal`, which uses only this user's own folders)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slimrl.export.journal import DONE, PLACING, STAGE_MARK, clean_stale, fingerprint, write_journal

__all__ = ["MANIFEST", "ExportConflictError", "ExportWriteError", "check_target", "clean_stale", "staged_directory"]

MANIFEST = ".slimrl-export.json"
# what an export of any kind may write; a same-named file not in the manifest is the user's
EXPORT_NAMES = re.compile(
    r"^(config\.json|generation_config\.json|model.*\.safetensors(\.index\.json)?|"
    r"pytorch_model.*\.bin(\.index\.json)?|tokenizer.*|special_tokens_map\.json|vocab\.json|"
    r"merges\.txt|chat_template\.(jinja|json)|added_tokens\.json|README\.md|adapter_.*|"
    r".*\.gguf|Modelfile|preprocessor_config\.json|processor_config\.json)$"
)
WEIGHTS = re.compile(
    r"^(model.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?|"
    r"adapter_model\.(safetensors|bin))$"
)


class ExportConflictError(FileExistsError):
    """The export would replace or sit beside files it does not own: one line naming them and the fix."""


def _manifest(target: Path) -> dict:
    try:
        data = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def owned(target: Path) -> set[str]:
    """The files the last export wrote into ``target`` and that are still as it wrote them (its manifest; a file
    edited since, a user's now, is not; empty when there is no manifest or it is unreadable)."""
    data = _manifest(target)
    marks = data.get("fingerprints", {}) if isinstance(data.get("fingerprints"), dict) else {}
    out = set()
    for name in (f for f in data.get("files", []) if isinstance(f, str)):
        path = target / name
        if name in marks and path.is_file() and fingerprint(path) != marks[name]:
            continue  # edited by hand after the export
        out.add(name)
    return out


def export_kind(target: Path) -> str | None:
    """What the last export into ``target`` wrote (``lora``, ``merged_16bit``, ``gguf``, ...), where recorded."""
    kind = _manifest(target).get("kind")
    return kind if isinstance(kind, str) else None


def _foreign(target: Path, names: set[str] | None) -> list[str]:
    """Files in ``target`` that are not the last export's and that the export would replace (``names``; None: any
    name an export may write) or whose weights it would sit beside."""
    if not target.is_dir():
        return []
    mine = owned(target)
    out = []
    for path in sorted(p for p in target.iterdir() if p.is_file() and p.name != MANIFEST):
        name = path.name
        if name in mine:
            continue
        replaced = name in names if names is not None else bool(EXPORT_NAMES.match(name))
        if replaced or WEIGHTS.match(name):
            out.append(name)
    return out


def check_target(
    target: str | Path, overwrite: bool = False, names: set[str] | None = None, kind: str | None = None
) -> None:
    """Refuse (one line) an export into ``target`` that would replace or shadow files it does not own: a file
    there of a name the export writes, edited since an earlier export wrote it, or another kind of export's files
    (``kind``: this one's); a symbolic link (it would write wherever the link points: an adapter folder, say)."""
    target = Path(target)
    if target.is_symlink():
        raise ExportConflictError(
            f"{target} is a symbolic link (to {os.readlink(target)}): an export writes into a "
            f"folder of its own; remove the link or choose another output folder"
        )
    if target.exists() and not target.is_dir():
        raise ExportConflictError(f"{target} is a file, not a folder: choose another output folder")
    if overwrite:
        return
    before = export_kind(target) if target.is_dir() else None
    if kind is not None and before is not None and before != kind and owned(target):
        raise ExportConflictError(
            f"{target} holds a {before} export; a {kind} export there would remove it: choose "
            f"another folder, or pass overwrite=True (slimrl export --overwrite)"
        )
    foreign = _foreign(target, names)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ExportConflictError(
            f"{target} holds {shown}, not written by a slimrl export: choose an empty folder, "
            f"or pass overwrite=True (slimrl export --overwrite) to replace them"
        )


def temp_directory(kind: str) -> tempfile.TemporaryDirectory:
    """A temporary folder for ``kind`` (``merged``, ``gguf``, ``push``) whose name carries this process's id."""
    return tempfile.TemporaryDirectory(prefix=f"slimrl-{kind}-{os.getpid()}-")


class ExportWriteError(OSError):
    """The export could not be written (a full disk, a folder where a file goes): one line; the folder is as it
    was."""


def _write_error(exc: BaseException, target: Path) -> ExportWriteError | None:
    text = str(exc)
    if getattr(exc, "errno", None) == 28 or "No space left" in text or "StorageFull" in text:
        error = ExportWriteError(
            f"{target}: no space left on the device while writing the export; free space or "
            f"choose another folder (nothing was changed there)"
        )
        error.errno = 28
        return error
    return None


@contextmanager
def staged_directory(target: str | Path, overwrite: bool = False, kind: str | None = None) -> Iterator[Path]:
    """A fresh directory beside ``target`` to write into; when the block succeeds, the files of the previous export
    that this one does not write again are removed, each new file is moved into ``target`` under its own name
    (``os.replace``: a reader sees the old file or the complete new one) and the manifest is rewritten; when it
    fails, the staging directory is deleted and ``target`` is as it was. Files the export does not own are refused
    (module docstring) before the block runs and again before anything is moved."""
    target = Path(target)
    check_target(target, overwrite, kind=kind)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target):
        clean_stale(target.parent)
        yield from _staged(target, overwrite, kind)


@contextmanager
def _exclusive(target: Path) -> Iterator[None]:
    """One export into ``target`` at a time (``flock`` on a lock file beside it): a second is one line."""
    import fcntl

    lock = target.parent / f".{target.name}.export-lock"
    try:  # never through a link, and only a file of this user's that nothing else names (a hard link would)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ExportConflictError(
            f"{target}: the export's lock file {lock} cannot be opened ({exc.strerror}: a "
            f"link or another user's file); remove it or choose another output folder"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
        os.close(fd)
        raise ExportConflictError(
            f"{target}: the export's lock file {lock} is not a file of yours alone (owner uid "
            f"{st.st_uid}, {st.st_nlink} names); remove it or choose another output folder"
        )
    with os.fdopen(fd, "r+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = f.read().strip() or "another process"
            raise ExportConflictError(
                f"{target}: another export is writing there now (pid {holder}); wait for it "
                f"or choose another output folder"
            ) from None
        f.seek(0), f.truncate(), f.write(str(os.getpid())), f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _staged(target: Path, overwrite: bool, kind: str | None) -> Iterator[Path]:
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-{os.getpid()}-", dir=target.parent))
    (stage / STAGE_MARK).touch()
    try:
        try:
            yield stage
        except Exception as exc:
            error = _write_error(exc, target)
            if error is not None:
                raise error from None
            raise
        new = {str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file() and p.name != STAGE_MARK}
        check_target(target, overwrite, names=new, kind=kind)
        blocked = [rel for rel in sorted(new) if (target / rel).is_dir() or (target / rel).is_symlink()]
        if blocked:
            raise ExportConflictError(
                f"{target}: {blocked[0]} is a folder or a link where the export writes a file; "
                f"move it away or choose another output folder (nothing was changed)"
            )
        target.mkdir(parents=True, exist_ok=True)
        stale = owned(target) - new
        if overwrite:  # the weights of another save beside the new ones would be loaded instead of them
            stale |= {name for name in _foreign(target, new) if WEIGHTS.match(name)}
        _swap_in(target, stage, new, stale, kind)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _swap_in(target: Path, stage: Path, new: set[str], stale: set[str], kind: str | None) -> None:
    """Every file the export replaces or retires moved to a backup folder first, then the new files in; any
    failure puts the backup back, so ``target`` holds the old export or the whole new one, never a mix."""
    backup = Path(tempfile.mkdtemp(prefix=f".{target.name}.backup-{os.getpid()}-", dir=target.parent))
    (backup / STAGE_MARK).touch()
    write_journal(backup, stage, new)
    saved, placed = [], []
    try:
        for rel in sorted(stale | {r for r in new if (target / r).exists()} | {MANIFEST}):
            if (target / rel).is_file():
                (backup / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(target / rel, backup / rel)
                saved.append(rel)
        (backup / PLACING).touch()
        for rel in sorted(new):
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / rel, target / rel)
            placed.append(rel)
        manifest = {"files": sorted(new), "fingerprints": {r: fingerprint(target / r) for r in sorted(new)}}
        (target / MANIFEST).write_text(json.dumps({**manifest, **({"kind": kind} if kind else {})}, indent=1) + "\n")
        (backup / DONE).touch()
    except BaseException as exc:
        for rel in placed:
            (target / rel).unlink(missing_ok=True)
        for rel in saved:
            os.replace(backup / rel, target / rel)
        error = _write_error(exc, target) if isinstance(exc, Exception) else None
        if error is not None:
            raise error from None
        raise
    finally:
        shutil.rmtree(backup, ignore_errors=True)


def size_text(path: str | Path) -> str:
    """A file's (or directory's total) size as ``12.3 MB``."""
    path = Path(path)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
    return f"{size / 2**20:.1f} MB"
