"""Writing exports so that a failure never leaves a partial file under a final name, and never touches anything else
in the directory (an adapter, checkpoints, the user's own files)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def staged_directory(target: str | Path) -> Iterator[Path]:
    """A fresh directory beside ``target`` to write into; when the block succeeds each file in it is moved into
    ``target`` under its own name (``os.replace``: a reader sees the old file or the complete new one); when it
    fails, the staging directory is deleted and ``target`` is as it was."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        yield stage
        target.mkdir(parents=True, exist_ok=True)
        for src in sorted(p for p in stage.rglob("*") if p.is_file()):
            dst = target / src.relative_to(stage)
            dst.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dst)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def size_text(path: str | Path) -> str:
    """A file's (or directory's total) size as ``12.3 MB``."""
    path = Path(path)
    size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
    return f"{size / 2**20:.1f} MB"
