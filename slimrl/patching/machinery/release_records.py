"""The per-release record files beside this module (``contracts.json``, ``fingerprints.json``): for each target,
the values seen in the tested TRL releases, each value with the releases that had it. One way to add a release and
to write a file, for both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read(path: Path) -> dict[str, list[dict]]:
    return json.loads(path.read_text()) if path.is_file() else {}


def add_release(data: dict[str, list[dict]], key: str, field: str, value: Any, release: str) -> None:
    """``release`` had ``value`` (under ``field``) for ``key``: it leaves any entry with another value (an entry left
    with no release goes) and joins, or starts, the entry with this one."""
    from packaging.version import Version

    entries = data.setdefault(key, [])
    for entry in entries:
        if release in entry["releases"] and entry[field] != value:
            entry["releases"].remove(release)
    entries[:] = [e for e in entries if e["releases"]]
    same = next((e for e in entries if e[field] == value), None)
    if same is None:
        entries.append({"releases": [release], field: value})
    elif release not in same["releases"]:
        same["releases"] = sorted({*same["releases"], release}, key=Version)


def write(path: Path, data: dict[str, list[dict]]) -> None:
    """``data`` as JSON, one target per line, sorted (reviewable diffs when a TRL release is added)."""
    lines = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in sorted(data.items())]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")
