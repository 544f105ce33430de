"""glibc malloc tuning: applied on Linux by default, and switchable off (its memory effect is in bench/)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = "from slimrl.compat.malloc import tune_malloc; print(tune_malloc())"


def _applied(env_value: str) -> str:
    env = dict(os.environ, SLIMRL_MALLOC_TUNING=env_value)
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                          check=True).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_tuning_applies_and_can_be_turned_off():
    assert _applied("1") == str(1 << 20)
    assert _applied("0") == "None"
