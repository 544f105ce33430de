"""A file replaced whole or not at all: written beside its destination under a temporary name, flushed to disk and
renamed over it (``os.replace`` is atomic on one filesystem), so a process killed mid-write leaves the old file (or
none), never an empty or half one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` afterwards; until the rename it holds what it held before."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
