"""docs/ARCHITECTURE.md's "Adding a trainer" and "Adding a route" sections name files, modules, record fields and
callables a newcomer will look for: every one they cite exists (a rename that leaves the guide behind fails here)."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "ARCHITECTURE.md"
SECTIONS = ("## Adding a trainer", "## Adding a route")


def _sections(text: str) -> str:
    """The text of :data:`SECTIONS`, each up to the next heading of its level."""
    parts = []
    for heading in SECTIONS:
        start = text.index(heading)
        nxt = text.find("\n## ", start + len(heading))
        parts.append(text[start : nxt if nxt != -1 else len(text)])
    return "\n".join(parts)


def _record_fields() -> set[str]:
    from slimrl.patching.spec import About, Route, TrainerSpec
    from slimrl.planning.settings import TrlStep, Workload

    return {f.name for cls in (TrainerSpec, About, Route, Workload, TrlStep) for f in dataclasses.fields(cls)}


def _callables() -> set[str]:
    import slimrl
    from slimrl.patching import spec
    from slimrl.patching.routes import fused_head
    from slimrl.patching.trainers import dpo
    from slimrl.planning import settings

    return {n for module in (slimrl, spec, settings, dpo, fused_head) for n in dir(module)}


def _path_exists(token: str) -> bool:
    """A path as the guide writes it: from the repository's root, from ``slimrl/`` or from ``slimrl/patching/``
    (``patching/spec.py``, ``routes/head.py``), a ``<name>`` placeholder standing for any file of its folder, a
    ``module.Name`` suffix for an attribute of the module."""
    token = token.rstrip("/")
    if "<" in token:
        token = token[: token.index("<")].rpartition("/")[0]
    module, _, attribute = token.partition(".") if not token.endswith((".py", ".md", ".json")) else (token, "", "")
    for base in (ROOT, ROOT / "slimrl", ROOT / "slimrl" / "patching"):
        for candidate in (base / token, base / f"{module}.py"):
            if candidate.exists():
                if attribute and candidate.suffix == ".py":
                    name = ".".join(candidate.relative_to(ROOT).with_suffix("").parts)
                    return hasattr(importlib.import_module(name), attribute)
                return True
    return False


def _dotted_exists(token: str) -> bool:
    """``slimrl.a.b.name()``: the longest importable module prefix, then attributes."""
    parts = token.removesuffix("()").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def missing(text: str) -> list[str]:
    """What ``text``'s backquoted names cite that does not exist."""
    from slimrl.patching.spec import Route

    fields, callables, out = _record_fields(), _callables(), []
    for token in re.findall(r"`([^`\n]+)`", text):
        if token.startswith("python -m "):  # a command: its module
            out += [] if _dotted_exists(token.split()[2]) else [token]
            continue
        if token.startswith(("slimrl ", "fetch", "[")):  # a command line, a shape
            continue
        if re.fullmatch(r"slimrl(\.\w+)+(\(\))?", token):
            out += [] if _dotted_exists(token) else [token]
            continue
        if "/" in token or token.endswith((".py", ".md", ".json")):
            out += [] if _path_exists(token) else [token]
            continue
        out += [f"{token}: {n}=" for n in re.findall(r"\b(\w+)=", token) if n not in fields]
        out += [f"{token}: {n}(" for n in re.findall(r"\b([A-Z]\w*)\(", token) if n not in callables]
        out += [f"{token}: .{n}" for n in re.findall(r"\bROUTE\.(\w+)", token) if not hasattr(Route, n)]
    return out


def test_the_adding_guides_cite_only_what_exists():
    cited = _sections(GUIDE.read_text())
    assert len(re.findall(r"`[^`\n]+`", cited)) > 40  # the sections are read, not skipped
    assert not missing(cited)


@pytest.mark.parametrize(
    "planted",
    [
        "`slimrl/patching/gone.py`",
        "`slimrl.patching.table.no_such_thing()`",
        "`SPEC = TrainerSpec(..., lost_field=1)`",
        "`ROUTE.vanished()`",
        '`routes=(GONE("x"),)`',
        "`python -m slimrl.no_such_module --x`",
        "`verify/scenarios.NoKit`",
    ],
)
def test_a_stale_name_is_seen(planted):
    assert missing(planted) != []
