"""Patches for TRL's ``ORPOTrainer`` (``trl.experimental.orpo``; the same code in TRL 1.12 and 1.16).

| TRL attribute                        | replaced by                                   |
|--------------------------------------|-----------------------------------------------|
| ``ORPOTrainer.concatenated_forward`` | :func:`slimrl_orpo_concatenated_forward`      |
| ``ORPOTrainer.__init__``             | legacy keywords (:mod:`slimrl.patching.legacy`)|
| ``ORPOTrainer.training_step``        | NaN/inf stop (:mod:`slimrl.patching.guards`)   |

ORPO (Hong et al. 2024, https://huggingface.co/papers/2403.07691):
``L = NLL(chosen) - mean(beta * log sigmoid(log_odds))``, ``log_odds = (lp_c - lp_r) - (log1p(-e^lp_c) -
log1p(-e^lp_r))`` with ``lp`` the *average* completion log-prob. TRL's ``odds_ratio_loss`` and
``get_batch_loss_metrics`` stay TRL's; only the forward that feeds them changes (:mod:`slimrl.patching.preference`).
"""

from __future__ import annotations

import torch

from slimrl.patching.config_fields import CHUNK_FIELDS, config_patches
from slimrl.patching.legacy import legacy_trainer_init_factory
from slimrl.patching.preference import ConcatenatedSpec, concatenated_forward_through_ops
from slimrl.patching.registry import Patch, original, register
from slimrl.patching.steps import training_step_factory

TRAINER = "trl.experimental.orpo.orpo_trainer:ORPOTrainer"
CONFIG = "trl.experimental.orpo.orpo_config:ORPOConfig"


def _orpo_nll_labels(trainer, cat: dict) -> torch.Tensor:
    """ORPO's NLL runs over prompt and response: every attended token of the chosen rows."""
    ids, mask = cat["concatenated_input_ids"], cat["concatenated_attention_mask"]
    return torch.where(mask == 1, ids, -100)


ORPO_SPEC = ConcatenatedSpec(
    padding_value=lambda trainer: trainer.padding_value,
    nll_labels=_orpo_nll_labels,
    average_log_prob=lambda trainer: True,
    logits_drop_last=True,
)


def slimrl_orpo_concatenated_forward(self, model, batch):
    """TRL's ``ORPOTrainer.concatenated_forward`` without the ``[2B, T, V]`` logits (same outputs)."""
    return concatenated_forward_through_ops(self, model, batch, ORPO_SPEC, original(TRAINER, "concatenated_forward"))


PATCHES = [
    register(Patch("orpo", TRAINER, "concatenated_forward", slimrl_orpo_concatenated_forward)),
    register(Patch("orpo", TRAINER, "__init__", legacy_trainer_init_factory, wrap=True)),
    register(Patch("orpo", TRAINER, "training_step", training_step_factory, wrap=True)),
    *(register(p) for p in config_patches("orpo", CONFIG, fields=CHUNK_FIELDS)),
]
