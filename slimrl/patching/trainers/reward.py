"""Patches for TRL's ``RewardTrainer`` (TRL 1.12 and 1.16).

Bradley-Terry reward modelling (``L = -log sigmoid(r_chosen - r_rejected [- margin])``, Ouyang et al. 2022,
https://huggingface.co/papers/2203.02155) on a sequence-classification model: the head outputs one score per
sequence, so there is no vocabulary-sized tensor for :mod:`slimrl.ops` to avoid. Only the legacy keywords are
patched; activation memory is handled by ``FastLanguageModel.get_peft_model``'s checkpointing.
"""

from __future__ import annotations

from slimrl.patching.spec import CHECKS_ONLY, PAIRED, About, TrainerSpec

TRAINER = "trl.trainer.reward_trainer:RewardTrainer"
CONFIG = "trl.trainer.reward_config:RewardConfig"

PATCHES: list = []  # only the shared patches (slimrl.patching.table)


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): a one-score model trained on the 4 pairs as
    whole texts."""
    args = kit.config(per_device_train_batch_size=4)
    rows = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in kit.PAIRS]
    return kit.trainer(model=kit.model(kind="scorer"), args=args, train_dataset=kit.dataset(rows))


SPEC = TrainerSpec(
    "reward",
    TRAINER,
    CONFIG,
    layouts=(*PAIRED, ("chosen_ids", "rejected_ids"), ("chosen_input_ids", "rejected_input_ids")),
    about=About(
        note="none needed: a one-score head, no vocabulary-sized tensor; checks and guards only",
        scenario=scenario,
        layer=CHECKS_ONLY,
    ),
)
