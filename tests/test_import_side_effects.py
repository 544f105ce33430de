"""Importing slimrl changes nothing in the user's process: no exception hook, no warning filter, no patch registered
(each is set up by slimrl's own entry points: ``PatchFastRL``, the first use of ``FastLanguageModel``, the
``slimrl`` command). The command hides the third-party deprecation notices a user cannot act on, and only those."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

CHECK = """
import sys, warnings
import torch, transformers, trl, peft, accelerate, datasets  # their own filters are theirs: set before the snapshot
hook, filters = sys.excepthook, list(warnings.filters)
import slimrl, slimrl.patching, slimrl.verify, slimrl.rewards
from slimrl.patching.machinery import registry
print("hook", sys.excepthook is hook, "filters", warnings.filters == filters, "registered", len(registry._REGISTRY))
STEP
print("after", sys.excepthook is not hook, len(registry._REGISTRY) > 0)
"""


def _run(step: str) -> list[str]:
    env = dict(os.environ, SLIMRL_AUTOPATCH="1")  # the suite turns the patch-on-first-use off; a user has it on
    out = subprocess.run(
        [sys.executable, "-c", CHECK.replace("STEP", step)], capture_output=True, text=True, timeout=300, env=env
    )
    return [ln for ln in out.stdout.splitlines() if ln.startswith(("hook", "after"))] or [out.stderr[-2000:]]


def test_import_sets_nothing_and_the_entry_points_do():
    for step in ("slimrl.PatchFastRL('grpo')", "slimrl.FastLanguageModel"):
        first, after = _run(step)
        assert first == "hook True filters True registered 0", first
        assert after == "after True True", (step, after)


def test_the_command_hides_third_party_deprecations_only():
    from slimrl.cli.quiet import quiet_third_party

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_third_party()
        for module in ("transformers.modeling_utils", "peft.tuners", "trl.trainer.grpo_trainer", "my_script"):
            warnings.warn_explicit("old call", FutureWarning, "x.py", 1, module=module)
        warnings.warn_explicit("a real problem", UserWarning, "x.py", 1, module="transformers.trainer")
    shown = [(str(w.message), w.category.__name__) for w in seen]
    assert shown == [("old call", "FutureWarning"), ("a real problem", "UserWarning")], shown  # my_script's, kept
