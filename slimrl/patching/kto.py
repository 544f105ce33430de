"""Patches for TRL's ``KTOTrainer``.

| TRL attribute            | replaced by                                              |
|--------------------------|----------------------------------------------------------|
| ``KTOTrainer.__init__``  | legacy keywords (:mod:`slimrl.patching.legacy`)          |
| ``KTOTrainer.training_step``| NaN/inf stop (:mod:`slimrl.patching.guards`)             |
| fused-head kernel (TRL >= 1.15) | :mod:`slimrl.patching.fused_head` (shared with DPO, SFT, RLOO) |

KTO (Ethayarajh et al. 2024, https://huggingface.co/papers/2402.01306): unpaired desirable/undesirable examples,
``L = w_d (1 - sigmoid(beta (r - z_ref)))`` for desirable and ``w_u (1 - sigmoid(beta (z_ref - r)))`` for
undesirable ones, ``r`` the policy/reference log-ratio and ``z_ref`` a KL estimate from mismatched pairs; TRL's own
``kto`` and ``apo_zero_unpaired`` losses. From TRL 1.15 the log-probs (policy, reference and the KL pass) come from
TRL's fused head, whose kernel slimrl swaps. TRL 1.12 reads full logits inside ``_compute_loss`` (log-probs and
metrics in one method), which slimrl leaves as TRL's.
"""

from __future__ import annotations

from slimrl.patching.config_fields import CHUNK_FIELDS, config_patches
from slimrl.patching.fused_head import fused_head_trainer_patches, has_fused_head
from slimrl.patching.legacy import legacy_trainer_init_factory
from slimrl.patching.registry import Patch, register
from slimrl.patching.steps import training_step_factory

TRAINER = "trl.trainer.kto_trainer:KTOTrainer"
CONFIG = "trl.trainer.kto_config:KTOConfig"

PATCHES = [
    register(Patch("kto", TRAINER, "__init__", legacy_trainer_init_factory, wrap=True)),
    register(Patch("kto", TRAINER, "training_step", training_step_factory, wrap=True)),
    *fused_head_trainer_patches("kto", TRAINER),
    # slimrl's chunking acts through the fused head only (TRL >= 1.15); on older TRL the config refuses it
    *(register(p) for p in config_patches("kto", CONFIG, fields=CHUNK_FIELDS if has_fused_head() else ())),
]
