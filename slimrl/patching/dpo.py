"""Patches for TRL's ``DPOTrainer``.

| TRL attribute                   | replaced by                                                      |
|---------------------------------|------------------------------------------------------------------|
| ``DPOTrainer.__init__``         | legacy keywords (:mod:`slimrl.patching.legacy`), e.g. ``beta=``  |
| ``DPOTrainer.training_step``    | NaN/inf stop (:mod:`slimrl.patching.guards`)                     |
| fused-head kernel (TRL >= 1.15) | :mod:`slimrl.patching.fused_head` (shared with KTO, SFT, RLOO)   |

DPO (Rafailov et al. 2023, https://huggingface.co/papers/2305.18290): ``L = -log sigmoid(beta * ((lp_c - lp_ref_c)
- (lp_r - lp_ref_r)))`` and TRL's 14 other ``loss_type`` values, all TRL's own code. From TRL 1.15 on, the
policy and reference log-probs come from TRL's fused LM head, whose kernel slimrl swaps for its own on devices
without Triton (valid positions only, small row blocks; :mod:`slimrl.patching.fused_head`).

TRL 1.12 computes them in ``_compute_loss``, one method that reads the full ``[2B, T, V]`` logits for the log-probs
*and* for six metrics and three loss terms (entropy, mean logits, top-1 accuracy, the ``sft`` loss, WPO weights),
so there is no boundary to replace without rewriting that method: on 1.12 DPO trains as TRL does, with only the
legacy keywords added. Use TRL >= 1.15 for the memory savings.
"""

from __future__ import annotations

from slimrl.patching.config_fields import CHUNK_FIELDS, config_patches
from slimrl.patching.fused_head import fused_head_trainer_patches, has_fused_head
from slimrl.patching.legacy import legacy_trainer_init_factory
from slimrl.patching.registry import Patch, register
from slimrl.patching.steps import training_step_factory

TRAINER = "trl.trainer.dpo_trainer:DPOTrainer"
CONFIG = "trl.trainer.dpo_config:DPOConfig"

PATCHES = [
    register(Patch("dpo", TRAINER, "__init__", legacy_trainer_init_factory, wrap=True)),
    register(Patch("dpo", TRAINER, "training_step", training_step_factory, wrap=True)),
    *fused_head_trainer_patches("dpo", TRAINER),
    # slimrl's chunking acts through the fused head only (TRL >= 1.15); on older TRL the config refuses it
    *(register(p) for p in config_patches("dpo", CONFIG, fields=CHUNK_FIELDS if has_fused_head() else ())),
]
