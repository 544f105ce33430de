"""Patches for TRL's ``PRMTrainer`` (``trl.experimental.prm``; the last release that has it is TRL 1.13.0).

Process reward modelling (Uesato et al. 2022, https://huggingface.co/papers/2211.14275): a token-classification
model labels each reasoning step correct/incorrect with cross-entropy over 2 classes at the step separators. The
head is ``[H, num_labels]``, not vocabulary-sized, so there is nothing for :mod:`slimrl.ops` to avoid; only the
legacy keywords are patched.
"""

from __future__ import annotations

from slimrl.compat.trl_info import UNTIL_1_13
from slimrl.patching.spec import CHECKS_ONLY, row

TRAINER = "trl.experimental.prm.prm_trainer:PRMTrainer"
CONFIG = "trl.experimental.prm.prm_config:PRMConfig"

PATCHES: list = []  # only the shared patches (slimrl.patching.table)


SPEC = row("prm", TRAINER, CONFIG,
           instead="a token-classification model trained with transformers' Trainer",
           releases=UNTIL_1_13, last_release="1.13.0",
           not_verified="slimrl adds only checks to PRM (a 2-class head)",
           layouts=(("prompt", "completions", "labels"), ("input_ids",)),
           note="none needed: a 2-class token head; checks and guards only", layer=CHECKS_ONLY)
