"""Patches for TRL's ``PRMTrainer`` (``trl.experimental.prm``; the last release that has it is TRL 1.12.0).

| TRL attribute            | replaced by                                      |
|--------------------------|--------------------------------------------------|
| ``PRMTrainer.__init__``  | legacy keywords (:mod:`slimrl.patching.legacy`)  |
| ``PRMTrainer.training_step``| NaN/inf stop (:mod:`slimrl.patching.guards`)     |

Process reward modelling (Uesato et al. 2022, https://huggingface.co/papers/2211.14275): a token-classification
model labels each reasoning step correct/incorrect with cross-entropy over 2 classes at the step separators. The
head is ``[H, num_labels]``, not vocabulary-sized, so there is nothing for :mod:`slimrl.ops` to avoid; only the
legacy keywords are patched.
"""

from __future__ import annotations

from slimrl.patching.config_fields import config_patches
from slimrl.patching.legacy import legacy_trainer_init_factory
from slimrl.patching.registry import LAST_RELEASE_112 as LAST_RELEASE
from slimrl.patching.registry import Patch, register
from slimrl.patching.steps import training_step_factory

TRAINER = "trl.experimental.prm.prm_trainer:PRMTrainer"
CONFIG = "trl.experimental.prm.prm_config:PRMConfig"

PATCHES = [
    register(Patch("prm", TRAINER, "__init__", legacy_trainer_init_factory, wrap=True, versions=LAST_RELEASE)),
    register(Patch("prm", TRAINER, "training_step", training_step_factory, wrap=True, versions=LAST_RELEASE)),
    *(register(p) for p in config_patches("prm", CONFIG, fields=(), versions=LAST_RELEASE)),
]
