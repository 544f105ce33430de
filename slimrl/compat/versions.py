"""``Version`` as Unsloth's helper (``unsloth_zoo.utils.Version``) behaves, which its vision notebooks import:
``Version("trl")`` is the installed release of a package, ``Version("0.24.0")`` that version; both comparable."""

from __future__ import annotations

import re
from importlib import metadata

from packaging.version import Version as _PackagingVersion

_LEADING = re.compile(r"\d+(?:\.\d+)*")


def Version(version: str | object) -> _PackagingVersion:  # noqa: N802 - Unsloth's name
    """A version string (its leading release number: ``"2.13.0+cpu"`` is 2.13.0), or the installed release of the
    package of that name; ValueError naming both readings when it is neither."""
    text = str(version).strip()
    found = _LEADING.match(text)
    if found:  # a version number (what follows its release part, "+cpu", ".dev0", is not compared)
        return _PackagingVersion(found.group(0))
    try:
        installed = metadata.version(text)
    except (metadata.PackageNotFoundError, ValueError):
        raise ValueError(f"Version({version!r}): neither a version number nor an installed package") from None
    found = _LEADING.match(installed)
    if found is None:
        raise ValueError(f"Version({version!r}): the installed release {installed!r} has no version number")
    return _PackagingVersion(found.group(0))
