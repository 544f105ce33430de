"""A quiet first contact: slimrl's own output comes first. bitsandbytes (imported by PEFT, which transformers'
Trainer imports) logged a notice about an optional CPU kernel slimrl never runs on every ``import slimrl``,
``slimrl --help`` and script, on CPUs that report AVX512-BF16 (slimrl/compat/runtime/bnb_notice.py drops that one
record). Each check runs in a fresh process; the notice is also emitted by hand there, so the check holds on CPUs where
bitsandbytes does not reach it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
NOTICE = (
    "import logging; logging.getLogger('bitsandbytes.backends.cpu.ops').warning("
    "'Failed to load CPU gemm_4bit_forward from kernels-community: %s', 'no kernels')"
)


def _run(argv: list[str]) -> list[str]:
    env = dict(os.environ, SLIMRL_AUTOPATCH="1", PYTHONWARNINGS="ignore")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    return [ln for ln in (out.stderr + out.stdout).splitlines() if ln.strip()]


@pytest.mark.parametrize(
    "code",
    ["import slimrl", "from slimrl import PatchFastRL; PatchFastRL()", "import slimrl, transformers.trainer, peft"],
)
def test_importing_and_patching_print_no_third_party_line(code):
    lines = _run([sys.executable, "-c", f"{code}\n{NOTICE}"])
    assert not any("gemm_4bit_forward" in ln for ln in lines), lines
    assert all(ln.startswith("slimrl") for ln in lines), lines


def test_the_commands_first_line_is_slimrls():
    for argv in ([str(BIN / "slimrl"), "--help"], [str(BIN / "slimrl"), "compare", "--help"]):
        lines = _run(argv)
        assert lines and lines[0].startswith(("usage: slimrl", "slimrl")), (argv, lines[:3])


def test_other_bitsandbytes_records_still_show():
    code = "import slimrl, logging; logging.getLogger('bitsandbytes.backends.cpu.ops').warning('another problem')"
    assert "another problem" in "\n".join(_run([sys.executable, "-c", code]))
