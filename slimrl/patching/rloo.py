"""Patches for TRL's ``RLOOTrainer`` (the log-prob method only on TRL < 1.15, before the fused LM head).

| TRL attribute                                        | replaced by                                         |
|------------------------------------------------------|-----------------------------------------------------|
| ``RLOOTrainer._get_per_token_logps_and_entropies``   | :func:`slimrl_rloo_get_per_token_logps_and_entropies` |
| ``RLOOTrainer.__init__``, ``RLOOConfig.__init__``    | legacy keywords (:mod:`slimrl.patching.legacy`)      |
| ``RLOOConfig`` fields                                | slimrl's fields (:mod:`slimrl.patching.config_fields`) |

RLOO (Ahmadian et al. 2024, https://huggingface.co/papers/2402.14740): REINFORCE with the leave-one-out mean of
the other ``k - 1`` samples' rewards as baseline, PPO-clipped sequence-level ratio. TRL < 1.15 computes the
completion log-probs from full ``[B, C, V]`` logits (``selective_log_softmax``) in the same method and with the same
contract as GRPO's, so the GRPO replacement (:func:`slimrl.patching.grpo.logps_and_entropies_through_ops`) serves
it. From TRL 1.15 on, RLOO runs through TRL's fused head and is covered by :mod:`slimrl.patching.fused_head`.
"""

from __future__ import annotations

from slimrl.patching.config_fields import config_patches
from slimrl.patching.grpo import logps_and_entropies_through_ops
from slimrl.patching.guards import finite_step_factory
from slimrl.patching.legacy import legacy_trainer_init_factory
from slimrl.patching.registry import Patch, register

TRAINER = "trl.trainer.rloo_trainer:RLOOTrainer"
CONFIG = "trl.trainer.rloo_config:RLOOConfig"


def slimrl_rloo_get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                                  batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                                  **multimodal):
    """Completion log-probs ``[B, C]`` (and entropies) under ``logits / self.temperature`` via :mod:`slimrl.ops`."""
    return logps_and_entropies_through_ops(TRAINER, self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size, compute_entropy, compute_aux_loss, **multimodal)


PATCHES = [
    register(Patch("rloo", TRAINER, "_get_per_token_logps_and_entropies",
                   slimrl_rloo_get_per_token_logps_and_entropies, versions="<1.15")),
    register(Patch("rloo", TRAINER, "__init__", legacy_trainer_init_factory, wrap=True)),
    register(Patch("rloo", TRAINER, "training_step", finite_step_factory, wrap=True)),
    *(register(p) for p in config_patches("rloo", CONFIG)),
]
