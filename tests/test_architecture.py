"""The import rules of docs/ARCHITECTURE.md, checked on the source (ast, function-level imports included): a rule
broken fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "slimrl"


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in SRC.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """Every slimrl/bench/tests module ``path`` imports, anywhere in the file: ``from pkg import sub`` counts as
    ``pkg.sub`` when that is a module, else as ``pkg``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] in ("slimrl", "bench", "tests")}


def _modules(room: str) -> dict[Path, set[str]]:
    return {p: _imports(p) for p in (SRC / room).rglob("*.py")}


def _outside(imported: set[str], *allowed: str) -> set[str]:
    return {m for m in imported if not any(m == a or m.startswith(a + ".") for a in allowed)}


def test_ops_import_only_compat():
    for path, imported in _modules("ops").items():
        assert not _outside(imported, "slimrl.ops", "slimrl.compat"), path


def test_compat_imports_nothing_else_of_slimrl():
    for path, imported in _modules("compat").items():
        assert not _outside(imported, "slimrl.compat"), path


def test_the_input_error_type_is_below_every_layer():
    """``slimrl.errors`` imports nothing of slimrl, so every layer may raise the one input-error type; no other module
    declares its own (a class named ``*InputError``, ``UsageError`` or ``VerifyError``)."""
    assert not _imports(SRC / "errors.py")
    for path in SRC.rglob("*.py"):
        classes = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)}
        own = {c for c in classes if c.endswith("InputError") or c in ("UsageError", "VerifyError")}
        assert not own or path == SRC / "errors.py", (path, own)


def test_export_reads_models_it_is_given():
    """Exporting works on the model object it is handed: it never reaches into patching, the CLI or the engine."""
    for path, imported in _modules("export").items():
        bad = _outside(imported, "slimrl.export", "slimrl.compat")
        assert not bad, (path, bad)


def test_environments_are_self_contained():
    """Environment servers (OpenEnv) know nothing of the trainers, models or the engine."""
    for path, imported in _modules("environments").items():
        bad = _outside(imported, "slimrl.environments", "slimrl.compat")
        assert not bad, (path, bad)


def test_health_only_reads_logs():
    """The run-health checks read the rows TRL logs: they never reach into patching, models or the CLI."""
    for path, imported in _modules("health").items():
        bad = _outside(imported, "slimrl.health", "slimrl.compat")
        assert not bad, (path, bad)


def test_planning_is_a_pure_predictor():
    """The planner reads configs and traces slimrl's ops and models; it never reaches into the trainers."""
    for path, imported in _modules("planning").items():
        bad = _outside(imported, "slimrl.planning", "slimrl.ops", "slimrl.compat", "slimrl.models", "slimrl.errors")
        assert not bad, (path, bad)


def test_generation_is_below_models_and_patching():
    """The generation layer (engine, HF fallback, server client) gets what it needs passed in: it never imports the
    models that own it, the trainers' patches or their state."""
    for path, imported in _modules("generation").items():
        bad = _outside(imported, "slimrl.generation", "slimrl.compat", "slimrl.ops")
        assert not bad, (path, bad)


def test_models_are_below_patching_verify_and_the_cli():
    """Loading, LoRA and mode switching use generation and export; they never reach up into the trainers' patches,
    the planner, verify or the CLI."""
    for path, imported in _modules("models").items():
        bad = _outside(imported, "slimrl.models", "slimrl.compat", "slimrl.generation", "slimrl.export", "slimrl.ops")
        assert not bad, (path, bad)


def test_patching_never_imports_verify():
    """verify runs the patches against TRL alone; the patches do not know verify (its scenarios are verify's)."""
    for path, imported in _modules("patching").items():
        bad = {m for m in imported if m.startswith(("slimrl.verify", "slimrl.cli"))}
        assert not bad, (path, bad)
    # nor by a string a child process imports (the self-check's child runs `slimrl verify --self-check-rows`)
    strung = [
        str(p.relative_to(SRC))
        for p in (SRC / "patching").rglob("*.py")
        if re.search(r"(from|import) slimrl\.(verify|cli)", p.read_text().split('"""', 2)[-1])
    ]
    assert not strung, strung


def test_no_file_over_500_lines():
    """Modules cut by concept, one job each, none over 500 lines (a cap, not a reason to split a concept)."""
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


def test_patching_layers():
    """``machinery`` (how a patch is installed and checked) < what every trainer gets (the modules directly in
    ``patching/``) < ``routes`` < ``online`` < ``trainers`` < the table (``table``) and ``PatchFastRL``: no layer
    imports one above it."""
    for path, imported in _modules("patching/machinery").items():
        bad = {m for m in imported if m.startswith("slimrl.patching") and not m.startswith("slimrl.patching.machinery")}
        assert not bad, (path, bad)
    top = {"slimrl.patching", "slimrl.patching.table", "slimrl.patching.doc_tables", "slimrl.patching.__main__"}
    layers = {
        "routes": ("slimrl.patching.online", "slimrl.patching.trainers"),
        "online": ("slimrl.patching.trainers",),
        "trainers": (),
    }
    for path, imported in _modules("patching").items():
        module = _module(path)
        assert not imported & top or module in top, (path, imported & top)
        sub = module.split(".")[2] if module.count(".") >= 2 else ""
        above = layers.get(sub, ("slimrl.patching.routes", "slimrl.patching.online", "slimrl.patching.trainers"))
        if module in top:
            continue
        bad = {m for m in imported if any(m == a or m.startswith(a + ".") for a in above)}
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


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_no_import_cycles():
    """No module imports, directly or through others, a module that imports it (function-level imports included;
    a package's ``__init__`` importing its own submodules is how packages work and is not counted)."""
    graph = {m: {t for t in map(_resolve, _imports(p)) if t and t != m} for m, p in MODULES.items()}
    for module, targets in graph.items():  # the package __init__ -> its own submodule edge is not a cycle maker
        if MODULES[module].name == "__init__.py":
            graph[module] = {t for t in targets if not t.startswith(module + ".")}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


def test_patching_has_no_per_trainer_module_at_the_top():
    """Shared machinery, routes, the online sub-package and trainers live in their own places."""
    from slimrl.patching.table import TRAINERS

    top = {p.stem for p in (SRC / "patching").glob("*.py")}
    assert not top & set(TRAINERS), top & set(TRAINERS)
    assert {p.stem for p in (SRC / "patching" / "trainers").glob("*.py")} - {"__init__"} == set(TRAINERS)


# Where trainers are described: their own modules, the table of them, and the table's half read from TRL (the
# trainers without a module: why each has no memory path, which inherit a verified route).
TABLE = ("slimrl.patching.trainers", "slimrl.patching.table", "slimrl.patching.derived")


def _trainer_name_lists(path: Path, names: set[str]) -> list[tuple[int, list[str]]]:
    """(line, names) of each tuple, list, set or dict-keys literal in ``path`` holding two or more of ``names``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        elts = (
            node.elts
            if isinstance(node, (ast.Tuple, ast.List, ast.Set))
            else node.keys
            if isinstance(node, ast.Dict)
            else None
        )
        found = sorted({e.value for e in elts or () if isinstance(e, ast.Constant) and e.value in names})
        if len(found) >= 2:
            out.append((node.lineno, found))
    return out


def test_only_the_trainer_table_spells_lists_of_trainer_names(tmp_path):
    """Knowledge about a trainer lives with it (its module, its row): every other list of trainers (verify's
    generation check and loss types, the planner's TRL baseline, PatchDPOTrainer's set, each route's users
    and entry methods) is derived from the table, so adding a trainer touches no module outside it."""
    from slimrl.patching.table import every_trainer

    names = set(every_trainer())
    spelled = {
        name: found
        for name, path in MODULES.items()
        if _outside({name}, *TABLE)
        for found in [_trainer_name_lists(path, names)]
        if found
    }
    assert not spelled, spelled
    planted = tmp_path / "planted.py"  # the check sees such a list where there is one
    planted.write_text('PROBED = ("grpo", "rloo")\nif name in ["dpo", "kto"]:\n    pass\nX = {"sft": 1, "cpo": 2}\n')
    assert sorted(line for line, _ in _trainer_name_lists(planted, names)) == [1, 2, 4]


def _module_names(tree: ast.AST) -> set[str]:
    """Local names bound to modules: ``import a.b as m``, ``import a`` and ``from pkg import mod [as m]`` where
    ``pkg.mod`` is one of slimrl's modules."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in MODULES)
    return names


def _module_rebinds(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each ``module.attr = ...`` and ``setattr(module, ...)`` on a name bound to a module."""
    tree = ast.parse(path.read_text())
    modules, out = _module_names(tree), []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in modules:
                    out.append((node.lineno, ast.unparse(sub)))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in modules
        ):
            out.append((node.lineno, ast.unparse(node)))
    return out


def test_attributes_of_other_modules_are_swapped_one_way(tmp_path):
    """Replacing a name in another module (TRL's, vLLM's, slimrl's own) and putting it back goes through
    ``slimrl.compat.runtime.swaps`` (which the patch registry installs through), never a hand-kept original."""
    allowed = {SRC / "compat" / "runtime" / "swaps.py"}
    hooks = {"sys.excepthook", "warnings.showwarning"}  # Python's documented hooks, set by assignment
    found = {
        str(p.relative_to(SRC)): hits
        for p in SRC.rglob("*.py")
        if p not in allowed and (hits := [h for h in _module_rebinds(p) if h[1] not in hooks])
    }
    assert not found, found
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from slimrl.ops import chunked_logprob as op\nimport trl\nop.auto_chunk_rows = None\nsetattr(trl, 'X', 1)\n"
    )
    assert [line for line, _ in _module_rebinds(planted)] == [3, 4]


def test_docstrings_name_only_what_exists():
    """Every ``:mod:`` / ``:func:`` / ``:class:`` / ``:data:`` / ``:meth:`` reference to slimrl in the source names a
    module and attribute that exist (a rename leaves no stale pointer behind)."""
    import importlib
    import re

    stale = []
    for path in SRC.rglob("*.py"):
        for ref in re.findall(r":(?:mod|func|class|data|meth|attr):`~?(slimrl\.[\w.]+)`", path.read_text()):
            parts = ref.split(".")
            k = next(k for k in range(len(parts), 0, -1) if ".".join(parts[:k]) in MODULES)
            obj = importlib.import_module(".".join(parts[:k]))
            for name in parts[k:]:
                obj = getattr(obj, name, None)
            if obj is None:
                stale.append((str(path.relative_to(SRC)), ref))
    assert not stale, stale
