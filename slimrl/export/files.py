"""Writing exports so that a failure never leaves a partial file under a final name, and an export never hides or
replaces a file it does not own.

Every export directory gets a manifest (:data:`MANIFEST`) listing the files the last export wrote there. The next
export into it removes those of them it does not write again (a sharded save after a single-file one: the old
``model.safetensors`` would otherwise shadow the new shards when transformers loads the folder) and nothing else;
a file of the same name it does not own (a user's ``README.md``, an adapter saved by hand) is refused in one line,
before anything is written, unless ``overwrite=True`` (``slimrl export --overwrite``). So are weight files of
another save the new export would sit beside. Temporary folders carry the process id in their name; a folder left by
a process that no longer exists (an export killed with ``kill -9``) is removed by the next export
(:func:`clean_stale`)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from slimrl.compat.processes import pid_alive

MANIFEST = ".slimrl-export.json"
# what an export of any kind may write; a same-named file not in the manifest is the user's
EXPORT_NAMES = re.compile(r"^(config\.json|generation_config\.json|model.*\.safetensors(\.index\.json)?|"
                          r"pytorch_model.*\.bin(\.index\.json)?|tokenizer.*|special_tokens_map\.json|vocab\.json|"
                          r"merges\.txt|chat_template\.(jinja|json)|added_tokens\.json|README\.md|adapter_.*|"
                          r".*\.gguf|Modelfile|preprocessor_config\.json|processor_config\.json)$")
WEIGHTS = re.compile(r"^(model.*\.safetensors(\.index\.json)?|pytorch_model.*\.bin(\.index\.json)?|"
                     r"adapter_model\.(safetensors|bin))$")
TEMP_PREFIXES = ("slimrl-merged-", "slimrl-gguf-", "slimrl-push-")


class ExportConflictError(FileExistsError):
    """The export would replace or sit beside files it does not own: one line naming them and the fix."""


def owned(target: Path) -> set[str]:
    """The files the last export wrote into ``target`` (its manifest; empty when there is none or it is unreadable)."""
    try:
        data = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return set()
    return {f for f in data.get("files", []) if isinstance(f, str)} if isinstance(data, dict) else set()


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


def check_target(target: str | Path, overwrite: bool = False, names: set[str] | None = None) -> None:
    """Refuse (one line) an export into ``target`` that would replace or shadow files it does not own."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise ExportConflictError(f"{target} is a file, not a folder: choose another output folder")
    if overwrite:
        return
    foreign = _foreign(target, names)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ExportConflictError(f"{target} holds {shown}, not written by a slimrl export: choose an empty folder, "
                                  f"or pass overwrite=True (slimrl export --overwrite) to replace them")


def clean_stale(*folders: str | Path) -> list[Path]:
    """Remove temporary export folders left by processes that are gone (their names carry the process id), in the
    system's temporary folder and in ``folders``. Returns what was removed."""
    removed = []
    places = [Path(tempfile.gettempdir()), *map(Path, folders)]
    pattern = re.compile(r"^(?:slimrl-(?:merged|gguf|push)-|\..+\.partial-)(\d+)-")
    for place in places:
        if not place.is_dir():
            continue
        for path in place.iterdir():
            match = pattern.match(path.name)
            if match and path.is_dir() and int(match.group(1)) != os.getpid() and not pid_alive(int(match.group(1))):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def temp_directory(kind: str) -> tempfile.TemporaryDirectory:
    """A temporary folder for ``kind`` (``merged``, ``gguf``, ``push``) whose name carries this process's id."""
    return tempfile.TemporaryDirectory(prefix=f"slimrl-{kind}-{os.getpid()}-")


@contextmanager
def staged_directory(target: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """A fresh directory beside ``target`` to write into; when the block succeeds, the files of the previous export
    that this one does not write again are removed, each new file is moved into ``target`` under its own name
    (``os.replace``: a reader sees the old file or the complete new one) and the manifest is rewritten; when it
    fails, the staging directory is deleted and ``target`` is as it was. Files the export does not own are refused
    (module docstring) before the block runs and again before anything is moved."""
    target = Path(target)
    check_target(target, overwrite)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(target.parent)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-{os.getpid()}-", dir=target.parent))
    try:
        yield stage
        new = {str(p.relative_to(stage)) for p in stage.rglob("*") if p.is_file()}
        check_target(target, overwrite, names=new)
        target.mkdir(parents=True, exist_ok=True)
        stale = owned(target) - new
        if overwrite:  # the weights of another save beside the new ones would be loaded instead of them
            stale |= {name for name in _foreign(target, new) if WEIGHTS.match(name)}
        for name in sorted(stale):
            (target / name).unlink(missing_ok=True)
        for rel in sorted(new):
            dst = target / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / rel, dst)
        (target / MANIFEST).write_text(json.dumps({"files": sorted(new)}, indent=1) + "\n")
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def die_with_parent() -> None:
    """In a child process before exec (``subprocess``'s ``preexec_fn``): end it when the exporting process dies, so
    a killed export leaves no converter running."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def size_text(path: str | Path) -> str:
    """A file's (or directory's total) size as ``12.3 MB``."""
    path = Path(path)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
    return f"{size / 2**20:.1f} MB"
