"""Which modules a piece of Python imports, read from its syntax tree without running it (Unsloth's
``check_python_modules``; the reward sandbox screens code with it before a process starts)."""

from __future__ import annotations

import ast
import sys
from typing import Any


def check_python_modules(code: str) -> tuple[bool, dict[str, Any]]:
    """``(ok, info)``: ``ok`` when ``code`` imports only standard-library modules (module docstring)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        return False, {"error": f"SyntaxError: {err}", "stdlib": [], "non_stdlib": [], "relative_imports": 0}
    imported: set[str] = set()
    relative = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                relative += 1
            elif node.module:
                imported.add(node.module.split(".")[0])
    stdlib = sorted(m for m in imported if m in sys.stdlib_module_names)
    other = sorted(m for m in imported if m not in sys.stdlib_module_names)
    return not other and not relative, {"stdlib": stdlib, "non_stdlib": other, "relative_imports": relative}
