"""Patches for TRL's ``PRMTrainer`` (``trl.experimental.prm``; the last release that has it is TRL 1.13.0).

Process reward modelling (Uesato et al. 2022, https://huggingface.co/papers/2211.14275): a token-classification
model labels each reasoning step correct/incorrect with cross-entropy over 2 classes at the step separators. The
head is ``[H, num_labels]``, not vocabulary-sized, so there is nothing for :mod:`slimrl.ops` to avoid; only the
legacy keywords are patched.
"""

from __future__ import annotations

from slimrl.compat.trl_info import UNTIL_1_13
from slimrl.patching.spec import CHECKS_ONLY, About, TrainerSpec

TRAINER = "trl.experimental.prm.prm_trainer:PRMTrainer"
CONFIG = "trl.experimental.prm.prm_config:PRMConfig"

PATCHES: list = []  # only the shared patches (slimrl.patching.table)


SPEC = TrainerSpec(
    "prm",
    TRAINER,
    CONFIG,
    instead="a token-classification model trained with transformers' Trainer",
    releases=UNTIL_1_13,
    layouts=(("prompt", "completions", "labels"), ("input_ids",)),
    about=About(
        note="none needed: a 2-class token head; checks and guards only",
        not_verified="slimrl adds only checks to PRM (a 2-class head)",
        layer=CHECKS_ONLY,
    ),
)
