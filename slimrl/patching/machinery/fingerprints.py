"""What the TRL methods slimrl re-implements *are*, not what their release is called: a hash of their code.

A version number does not say which code is installed: a patched fork, an editable install, a dev build or a patch
release (1.16.1) can carry a changed ``_get_per_token_logps_and_entropies`` under a version slimrl's tests know, and an
untested release (1.15.1) can carry exactly a tested one's. So each TRL method whose replacement computes what it
computed — the log-prob methods, the fused-head kernel, ``concatenated_forward`` / ``forward``, ``_compute_loss``
(:func:`computing`) — is fingerprinted: the SHA-256 of its source text (``inspect.getsource``, the same on every Python;
a class is its whole source) with the TRL helpers it calls (:mod:`slimrl.patching.machinery.reach`), provided the
code Python runs is what that source compiles to; so is the constructor of each trainer class patched. They are
recorded for every tested release in ``fingerprints.json`` by ``python -m slimrl.patching --record-contracts``.
:func:`code_changes` names the installed targets whose fingerprint is none of the recorded ones: the self-check runs
for their trainers (:mod:`slimrl.patching.every_trainer.preflight`), and its verdicts are cached under
the installed fingerprints (:func:`digest`), so a cached pass never outlives the code it was made on. A target whose
source cannot be read (no ``.py`` files installed) counts as changed.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

from slimrl.patching.machinery import reach, release_records

RECORD = Path(__file__).with_name("fingerprints.json")
COMPUTING_WRAPS = ("_compute_loss",)  # wrapped (not replaced) methods whose numbers the patched path changes


def computing(patch: Any) -> bool:
    """Whether ``patch`` replaces (or wraps and changes the numbers of) a TRL method: its target is fingerprinted."""
    return patch.target.startswith("trl.") and patch.guarded and (not patch.wrap or patch.attribute in COMPUTING_WRAPS)


def _source_sha(obj: Any) -> str | None:
    target = getattr(obj, "__func__", obj)
    try:
        source = inspect.getsource(target)
    except (OSError, TypeError):
        return None
    text = "\n".join(line.rstrip() for line in source.splitlines())
    return hashlib.sha256(text.encode()).hexdigest()


def fingerprint(obj: Any, owner: type | None = None) -> str | None:
    """SHA-256 of ``obj``'s source (lines stripped of trailing blanks) and, for a function, of the TRL functions it
    reaches (:func:`slimrl.patching.machinery.reach.reached`; ``owner``: its class); None when a source cannot be
    read or the code Python runs is not what the source compiles to (:func:`~slimrl.patching.machinery.reach.
    runs_its_source`)."""
    base = _source_sha(obj)
    fn = reach.function_of(obj)
    if base is None or fn is None:
        return base
    parts = [base]
    for label, callee in sorted({"": fn, **reach.reached(fn, owner)}.items()):
        sha = _source_sha(callee)
        if sha is None or not reach.runs_its_source(callee):
            return None
        parts.append(f"{label} {sha}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _owner(p) -> type | None:
    owner = p.resolve() if ":" in p.target else None
    return owner if isinstance(owner, type) else None


def _live(patches) -> dict[str, str | None]:
    """``"target.attribute" -> fingerprint`` of the installed TRL's originals of the computing patches, and of the
    constructor of each class they patch (what sets up the state those methods read)."""
    from slimrl.patching.machinery.registry import is_installed, original

    out: dict[str, str | None] = {}
    for p in patches:
        if not computing(p) or not p.applies():
            continue
        key = f"{p.target}.{p.attribute}"
        try:
            value = original(p.target, p.attribute) if is_installed(p) else getattr(p.resolve(), p.attribute)
            owner = _owner(p)
        except (AttributeError, RuntimeError):  # a target this TRL lacks: the patch's own check says so
            continue
        if value is not None:  # TRL 1.15 without Triton has no kernel (None): nothing to fingerprint
            out[key] = fingerprint(value, owner)
        init = reach.function_of(reach.owner_value(owner, "__init__")) if owner is not None else None
        if init is not None and reach.from_package(init, "trl"):
            out.setdefault(f"{p.target}.__init__", fingerprint(init, owner))
    return out


@functools.lru_cache(maxsize=1)
def recorded() -> dict[str, list[dict]]:
    """``"target.attribute" -> [{"releases": [...], "sha256": ...}]`` (fingerprints.json)."""
    return release_records.read(RECORD)


def code_changes(patches) -> dict[str, str]:
    """``"target.attribute" -> algorithm names`` of the installed computing targets whose code no tested release
    had (module docstring)."""
    algorithms: dict[str, str] = {}
    for p in patches:
        for key in (f"{p.target}.{p.attribute}", f"{p.target}.__init__"):
            algorithms[key] = ",".join(sorted({*algorithms.get(key, "").split(","), *p.algorithms} - {""}))
    known = recorded()
    return {
        key: algorithms[key]
        for key, sha in _live(patches).items()
        if key in known and (sha is None or sha not in {e["sha256"] for e in known[key]})
    }


def digest(patches) -> str:
    """A short hash of every installed computing target's fingerprint: the self-check's verdicts are cached under
    it (with the versions)."""
    live = _live(patches)
    text = json.dumps(sorted(live.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def record(patches, release: str) -> dict[str, list[dict]]:
    """fingerprints.json with the installed release's fingerprints added."""
    data = release_records.read(RECORD)
    for key, sha in _live(patches).items():
        if sha is not None:
            release_records.add_release(data, key, "sha256", sha, release)
    return dict(sorted(data.items()))


def write(data: dict[str, list[dict]]) -> None:
    """fingerprints.json, one target per line."""
    release_records.write(RECORD, data)
