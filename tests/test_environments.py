"""The project's environments (tools/envs.py) hold the bytecode of what they install: on this machine and CI
``PYTHONDONTWRITEBYTECODE`` is set, so a module without its ``.pyc`` is compiled from source again by every process
that imports it — torch, transformers, TRL and PEFT took 12 of the 21 s an import of TRL's GRPO trainer took, paid by
each of the suite's hundreds of processes. uv installs write none; the build compiles them once."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


OURS = Path(sys.prefix).resolve().is_relative_to(ROOT)
MODULES = ["torch", "transformers.trainer", "trl.trainer.grpo_trainer", "peft.tuners.lora.layer"]


@pytest.mark.skipif(not OURS, reason="not one of tools/envs.py's environments")
@pytest.mark.parametrize("module", MODULES)
def test_installed_modules_have_their_bytecode(module):
    source = importlib.import_module(module).__file__
    assert Path(importlib.util.cache_from_source(source)).is_file(), f"{source} has no .pyc: rebuild with make envs"


def test_the_build_compiles_what_it_installed(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        envs = importlib.import_module("envs")
    finally:
        sys.path.remove(str(ROOT / "tools"))
    env = tmp_path / "env"
    site = env / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "good.py").write_text("x = 1\n")
    (site / "py2_only.py").write_text("print 'old'\n")  # another Python's syntax: skipped, not fatal
    (env / "bin").mkdir()
    (env / "bin" / "python").symlink_to(sys.executable)
    logged = []
    monkeypatch.setattr(envs, "_purelib", lambda path: str(site))  # a real environment asks its interpreter
    envs.compile_bytecode(env, logged.append)
    assert Path(importlib.util.cache_from_source(str(site / "good.py"))).is_file()
    assert not Path(importlib.util.cache_from_source(str(site / "py2_only.py"))).exists()
    assert "compileall" in logged[0]
