"""After PatchFastRL() + unpatch(), every attribute of every patched TRL object is the very object it was."""

from __future__ import annotations

import warnings

from slimrl import PatchFastRL, unpatch
from slimrl.patching.machinery.registry import patches


def _targets() -> dict[str, object]:
    """Every class and module the registry patches on this TRL (resolved by import path)."""
    found = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for p in patches():
            if not p.applies():
                continue
            try:
                found[p.target] = p.resolve()
            except (ImportError, AttributeError):  # a trainer this TRL does not ship
                continue
    return found


def _snapshot(objs: dict[str, object]) -> dict[str, dict[str, object]]:
    return {name: dict(vars(obj)) for name, obj in objs.items()}


def test_unpatch_restores_every_attribute_identically():
    unpatch()
    objs = _targets()
    assert len(objs) >= 8, f"expected the trainer classes, configs and modules; got {sorted(objs)}"
    before = _snapshot(objs)
    PatchFastRL()
    during = _snapshot(objs)
    changed = {
        (n, k)
        for n in objs
        for k in set(before[n]) | set(during[n])
        if before[n].get(k, "<missing>") is not during[n].get(k, "<missing>")
    }
    assert changed, "PatchFastRL() changed nothing: the test would be vacuous"
    unpatch()
    after = _snapshot(objs)
    for name in objs:
        assert before[name].keys() == after[name].keys(), f"{name}: attributes added or removed"
        for key, value in before[name].items():
            assert after[name][key] is value, f"{name}.{key} is not the original object after unpatch()"
