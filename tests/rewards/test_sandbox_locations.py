"""The sandbox works wherever the interpreter, the standard library and slimrl live (issue: a clone, a virtual
environment or an interpreter under ``/tmp`` collided with the view's own ``/tmp``: every call an IsolationError).

A copy of this machine's interpreter and standard library (hard links where the filesystem allows) is made under
``/tmp`` — in a folder with a space in its name, reached through a symbolic link — and the sandbox is built from it
exactly as from the real one; the view's own mount points are checked to avoid every bound path."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from slimrl.rewards import sandbox_view
from slimrl.rewards.process_sandbox import isolation_report, run_sandboxed

SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "tkinter", "ensurepip", "turtledemo", "__pycache__"}


def _copy(src: Path, dst: Path) -> None:
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:  # another filesystem
            shutil.copy2(a, b)

    shutil.copytree(
        src, dst, copy_function=link, symlinks=True, ignore=lambda d, names: [n for n in names if n in SKIP_DIRS]
    )


@pytest.fixture
def interpreter_under_tmp(monkeypatch):
    """This machine's interpreter and standard library copied under /tmp/<x>/my python/ (spaces), used through a
    symbolic link; the sandbox's view then binds them at /tmp/... ."""
    if not isolation_report()["ok"]:
        pytest.skip("no kernel isolation on this machine")
    real = Path(sandbox_view.interpreter())
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    if stdlib.parent.parent != real.parent.parent:
        pytest.skip("the interpreter does not sit beside its standard library (prefix/bin, prefix/lib)")
    base = Path(tempfile.mkdtemp(prefix="slimrl-copied-python-", dir="/tmp"))
    prefix = base / "my python"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(real, prefix / "bin" / real.name)
    _copy(stdlib, prefix / "lib" / stdlib.name)
    link = base / "linked"
    link.symlink_to(prefix)
    python = str((link / "bin" / real.name).resolve())
    roots = [str((prefix / "lib" / stdlib.name).resolve()), str(prefix / "lib" / stdlib.name / "lib-dynload")]
    monkeypatch.setattr(sandbox_view, "interpreter", lambda: python)
    monkeypatch.setattr(sandbox_view, "readable_roots", lambda: [r for r in roots if os.path.isdir(r)])
    import slimrl.rewards.process_sandbox as process_sandbox

    monkeypatch.setattr(process_sandbox, "interpreter", lambda: python, raising=False)
    monkeypatch.setattr(
        process_sandbox, "readable_roots", lambda: [r for r in roots if os.path.isdir(r)], raising=False
    )
    yield python
    shutil.rmtree(base, ignore_errors=True)


def test_a_call_from_an_interpreter_under_tmp_returns_its_value(interpreter_under_tmp):
    assert interpreter_under_tmp.startswith("/tmp/") and " " in interpreter_under_tmp
    assert any(p.startswith("/tmp/") for p in sandbox_view.read_only_paths())
    result = run_sandboxed("import math\ndef f(x):\n    return math.isqrt(x)", "f", [49], allow=["math"])
    assert result.failure is None and result.value == 7, result
    assert "mount namespace" in result.isolation


def test_the_child_sees_only_what_is_bound_under_tmp(interpreter_under_tmp):
    """With the interpreter under /tmp, the view's /tmp shows the bound paths only (read-only), nothing else of
    the host's /tmp."""
    marker = Path(tempfile.mkdtemp(prefix="slimrl-host-only-", dir="/tmp"))
    try:
        code = (
            "import os\ndef f(path):\n    try:\n        return sorted(os.listdir('/tmp'))\n"
            "    except OSError as e:\n        return str(e)"
        )
        result = run_sandboxed(code, "f", [str(marker)], allow=["os"], audit_hook=False)  # the kernel's view only
    finally:
        marker.rmdir()
    assert result.failure is None, result
    assert marker.name not in result.value and all(n.startswith("slimrl-copied-python-") for n in result.value)


@pytest.mark.parametrize(
    ("bound", "wanted", "chosen"),
    [
        (["/usr/lib", "/opt/py/bin/python3"], "/scratch", "/scratch"),
        (["/scratch/me/venv/lib/python3.11"], "/scratch", "/.slimrl-scratch-0"),
        (["/scratch", "/.slimrl-scratch-0/x"], "/scratch", "/.slimrl-scratch-1"),
        (["/.old/python"], "/.old", "/.slimrl-.old-0"),
    ],
)
def test_the_views_own_mount_points_avoid_every_bound_path(bound, wanted, chosen):
    assert sandbox_view.free_point(wanted, bound) == chosen


def test_tmp_gets_its_own_tmpfs_only_where_nothing_bound_lives_there(tmp_path):
    cfg = sandbox_view.launcher_config(
        tmp_path,
        Path(sys.modules["slimrl.rewards"].__file__).parent / "x.py",
        __import__("slimrl.rewards.sandbox_types", fromlist=["Limits"]).Limits(),
        5,
    )
    lives_in_tmp = any(p == "/tmp" or p.startswith("/tmp/") for p in cfg["read_only"])
    assert cfg["tmp_mount"] is not lives_in_tmp
    assert cfg["scratch"] == "/scratch" and cfg["old_root"] == "/.old"


def test_a_view_that_cannot_be_built_names_the_step_and_its_cause(monkeypatch):
    """The IsolationError says which step failed, on which path, and why; for a collision in the view (slimrl's own
    bug) it asks for a report — never "run as root" or "isolation='none'" first."""
    import json

    from slimrl.rewards import _sandbox_launch as launch
    from slimrl.rewards.answers import parse_answer
    from slimrl.rewards.sandbox_types import IsolationError, Limits

    launch.step("the scratch directory", "/scratch")
    line = launch.setup_failure(FileExistsError(17, "File exists", "/x/root/scratch"))
    assert "the scratch directory (/scratch) failed with FileExistsError" in line and "report" in line
    body = json.dumps({"failure": "isolation", "message": line, "error_type": "view"}).encode()
    result = parse_answer(len(body).to_bytes(8, "big") + body, 70, Limits(), "", 0.0, {})
    assert isinstance(result.failure, IsolationError) and "isolation='none'" not in str(result.failure)
    assert "namespaces" not in str(result.failure) and "/scratch" in str(result.failure)
    launch.step("binding read-only", "/usr/lib")
    assert "run as root" in launch.setup_failure(PermissionError(1, "Operation not permitted"))
