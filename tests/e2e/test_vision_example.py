"""``examples/vision_grpo.py`` (an Unsloth-vision-notebook-shaped script: ``FastVisionModel``, LoRA or full
training, image prompts through the patched GRPOTrainer) runs from where it is, as a user runs it, and reports its
rewards. Three steps: the plumbing, not the learning (the README's measured run shows the reward rise)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "vision_grpo.py"


def test_the_vision_example_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--steps", "3"], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = re.search(r"mean reward, first 5 steps ([\d.]+) -> last 5 steps ([\d.]+) \(3 steps\)", proc.stdout)
    assert line is not None, proc.stdout[-2000:]
