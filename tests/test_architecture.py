"""The import rules of docs/ARCHITECTURE.md, checked on the source (ast): a rule broken fails here."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "slimrl"


def _imports(path: Path) -> set[str]:
    """Every slimrl/bench/tests module ``path`` imports (absolute imports, anywhere in the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] in ("slimrl", "bench", "tests")}


def _modules(room: str) -> dict[Path, set[str]]:
    return {p: _imports(p) for p in (SRC / room).rglob("*.py")}


def test_ops_import_only_compat():
    for path, imported in _modules("ops").items():
        bad = {m for m in imported if not m.startswith(("slimrl.ops", "slimrl.compat"))}
        assert not bad, (path, bad)


def test_compat_imports_nothing_else_of_slimrl():
    for path, imported in _modules("compat").items():
        bad = {m for m in imported if not m.startswith("slimrl.compat")}
        assert not bad, (path, bad)


def test_trainer_modules_do_not_import_each_other():
    for path, imported in _modules("patching/trainers").items():
        bad = {m for m in imported if m.startswith("slimrl.patching.trainers")}
        assert not bad, (path, bad)


def test_only_cli_imports_cli_and_nothing_imports_bench_or_tests():
    for path in SRC.rglob("*.py"):
        imported = _imports(path)
        assert not {m for m in imported if m.split(".")[0] in ("bench", "tests")}, path
        if "cli" not in path.relative_to(SRC).parts and path.name != "__main__.py":  # python -m slimrl
            assert not {m for m in imported if m.startswith("slimrl.cli")}, path


def test_patching_is_flat_no_more():
    """Shared machinery, routes and trainers live in their own places (no per-trainer module at the top)."""
    from slimrl.patching.specs import TRAINERS

    top = {p.stem for p in (SRC / "patching").glob("*.py")}
    assert not top & set(TRAINERS), top & set(TRAINERS)
    assert {p.stem for p in (SRC / "patching" / "trainers").glob("*.py")} - {"__init__"} == set(TRAINERS)
