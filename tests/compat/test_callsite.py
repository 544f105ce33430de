"""slimrl's warnings name the user's line, and an error slimrl raises on purpose prints as one line at the user's
line (slimrl.compat.runtime.callsite); errors from the user's own code keep their traceback. Each case is a script run
in a fresh interpreter, as a user runs one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BATCH_WARNING = """\
from slimrl import PatchFastRL
PatchFastRL("grpo")
from trl import GRPOConfig
config = GRPOConfig(output_dir={out!r}, per_device_train_batch_size=3, num_generations=2, use_cpu=True)
"""

BAD_INPUT = """\
from slimrl import FastLanguageModel
model = FastLanguageModel.from_pretrained({model!r}, max_seq_length=-5)
"""

USER_BUG = """\
import slimrl
def reward(completions):
    return 1 / 0
reward([])
"""


def _run(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "user_script.py"
    script.write_text(code)
    full = {k: v for k, v in os.environ.items() if k != "SLIMRL_TRACEBACK"}
    full.update(PYTHONPATH=str(ROOT), SLIMRL_AUTOPATCH="0", **env)
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=300
    )


def test_a_warning_names_the_users_line(tmp_path):
    proc = _run(tmp_path, BATCH_WARNING.format(out=str(tmp_path / "out")))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{tmp_path / 'user_script.py'}:4: UserWarning: per_device_train_batch_size=3" in proc.stderr
    assert "sys:1" not in proc.stderr


def test_a_refusal_is_one_line_at_the_users_line(tmp_path, tiny_model_dir):
    proc = _run(tmp_path, BAD_INPUT.format(model=str(tiny_model_dir)))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-2] == "slimrl: ValueError: max_seq_length must be a positive int, got -5"
    assert lines[-1].startswith(f"  at {tmp_path / 'user_script.py'}:2: model = FastLanguageModel.from_pretrained(")
    full = _run(tmp_path, BAD_INPUT.format(model=str(tiny_model_dir)), SLIMRL_TRACEBACK="1")
    assert "Traceback" in full.stderr and "fast_language_model.py" in full.stderr


def test_an_error_in_the_users_code_keeps_its_traceback(tmp_path):
    proc = _run(tmp_path, USER_BUG)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "ZeroDivisionError" in proc.stderr and "slimrl:" not in proc.stderr
