"""Patched on import, as Unsloth is: ``from slimrl import FastLanguageModel`` patches TRL's trainers (one line on
stderr), ``SLIMRL_AUTOPATCH=0`` keeps TRL as it is, ``unpatch()`` undoes it. Each case in a fresh process (the
suite itself runs with ``SLIMRL_AUTOPATCH=0``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import trl
trls = trl.GRPOTrainer.training_step
import slimrl
before = trl.GRPOTrainer.training_step is trls
from slimrl import FastLanguageModel, FastModel, is_bfloat16_supported, PatchDPOTrainer
after = trl.GRPOTrainer.training_step is trls
slimrl.unpatch()
undone = trl.GRPOTrainer.training_step is trls
print("STATE", before, after, undone, issubclass(FastModel, FastLanguageModel), is_bfloat16_supported())
"""


def _run(env_value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SLIMRL_AUTOPATCH"}
    if env_value is not None:
        env["SLIMRL_AUTOPATCH"] = env_value
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("value", "patched"), [(None, True), ("0", False)])
def test_importing_fastlanguagemodel_patches_trl_unless_turned_off(value, patched):
    proc = _run(value)
    assert proc.returncode == 0, proc.stderr[-2000:]
    state = next(line for line in proc.stdout.splitlines() if line.startswith("STATE")).split()[1:]
    assert state[0] == "True"  # `import slimrl` alone changes nothing
    assert state[1] == str(not patched)  # the original method is in place only when not patched
    assert state[2] == "True"  # unpatch() restores TRL
    assert state[3] == "True" and state[4] == "False"  # FastModel, and no bf16 on this CPU
    said = [line for line in proc.stderr.splitlines() if line.startswith("slimrl: TRL's trainers are patched")]
    assert len(said) == (1 if patched else 0), proc.stderr[-2000:]
