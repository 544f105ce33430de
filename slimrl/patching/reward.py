"""Patches for TRL's ``RewardTrainer`` (TRL 1.12 and 1.16).

| TRL attribute               | replaced by                                      |
|-----------------------------|--------------------------------------------------|
| ``RewardTrainer.__init__``  | legacy keywords (:mod:`slimrl.patching.legacy`)  |
| ``RewardTrainer.training_step``| NaN/inf stop (:mod:`slimrl.patching.guards`)     |

Bradley-Terry reward modelling (``L = -log sigmoid(r_chosen - r_rejected [- margin])``, Ouyang et al. 2022,
https://huggingface.co/papers/2203.02155) on a sequence-classification model: the head outputs one score per
sequence, so there is no vocabulary-sized tensor for :mod:`slimrl.ops` to avoid. Only the legacy keywords are
patched; activation memory is handled by ``FastLanguageModel.get_peft_model``'s checkpointing.
"""

from __future__ import annotations

from slimrl.patching.config_fields import config_patches
from slimrl.patching.legacy import legacy_trainer_init_factory
from slimrl.patching.registry import Patch, register
from slimrl.patching.steps import training_step_factory

TRAINER = "trl.trainer.reward_trainer:RewardTrainer"
CONFIG = "trl.trainer.reward_config:RewardConfig"

PATCHES = [
    register(Patch("reward", TRAINER, "__init__", legacy_trainer_init_factory, wrap=True)),
    register(Patch("reward", TRAINER, "training_step", training_step_factory, wrap=True)),
    *(register(p) for p in config_patches("reward", CONFIG, fields=())),
]
