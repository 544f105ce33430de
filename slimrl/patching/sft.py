"""Patches for TRL's ``SFTTrainer``.

| TRL attribute            | replaced by                                              |
|--------------------------|----------------------------------------------------------|
| ``SFTTrainer.__init__``  | legacy keywords (:mod:`slimrl.patching.legacy`)          |
| ``SFTTrainer.training_step``| NaN/inf stop (:mod:`slimrl.patching.guards`)             |
| fused-head kernel (TRL >= 1.15) | :mod:`slimrl.patching.fused_head` (shared with DPO, KTO, RLOO) |

SFT: ``nll`` (mean token negative log-likelihood) or ``dft`` (Dynamic Fine-Tuning, Wu et al. 2025,
https://huggingface.co/papers/2508.05629: each token's NLL weighted by its detached probability), TRL's own code.
From TRL 1.15 the token log-probs come from TRL's fused head, whose kernel slimrl swaps (valid positions only).
TRL 1.16's ``chunked_nll`` is TRL's own chunked path and is left alone; on TRL 1.12, use ``loss_type="chunked_nll"``
(TRL's own; the default there) for the same effect.
"""

from __future__ import annotations

from slimrl.patching.config_fields import CHUNK_FIELDS, config_patches
from slimrl.patching.fused_head import fused_head_trainer_patches, has_fused_head
from slimrl.patching.legacy import legacy_trainer_init_factory
from slimrl.patching.registry import Patch, register
from slimrl.patching.steps import training_step_factory

TRAINER = "trl.trainer.sft_trainer:SFTTrainer"
CONFIG = "trl.trainer.sft_config:SFTConfig"

PATCHES = [
    register(Patch("sft", TRAINER, "__init__", legacy_trainer_init_factory, wrap=True)),
    register(Patch("sft", TRAINER, "training_step", training_step_factory, wrap=True)),
    *fused_head_trainer_patches("sft", TRAINER),
    # slimrl's chunking acts through the fused head only (TRL >= 1.15); on older TRL the config refuses it
    *(register(p) for p in config_patches("sft", CONFIG, fields=CHUNK_FIELDS if has_fused_head() else ())),
]
