"""Patches for TRL's ``RLOOTrainer`` (the log-prob method only on TRL < 1.15, before the fused LM head).

| TRL attribute                                        | replaced by                                         |
|------------------------------------------------------|-----------------------------------------------------|
| ``RLOOTrainer._get_per_token_logps_and_entropies``   | :func:`slimrl_rloo_get_per_token_logps_and_entropies` |
| ``RLOOTrainer.__init__``, ``RLOOConfig.__init__``    | legacy keywords (:mod:`slimrl.patching.legacy`)      |
| ``RLOOConfig`` fields                                | slimrl's fields (:mod:`slimrl.patching.config_fields`) |
| ``rloo_trainer.VLLMGeneration``                      | the model's engine (:mod:`slimrl.patching.generation`) |

RLOO (Ahmadian et al. 2024, https://huggingface.co/papers/2402.14740): REINFORCE with the leave-one-out mean of
the other ``k - 1`` samples' rewards as baseline, PPO-clipped sequence-level ratio. TRL < 1.15 computes the
completion log-probs from full ``[B, C, V]`` logits (``selective_log_softmax``) in the same method and with the same
contract as GRPO's, so the GRPO replacement (:func:`slimrl.patching.grpo.logps_and_entropies_through_ops`) serves
it. From TRL 1.15 on, RLOO runs through TRL's fused head and is covered by :mod:`slimrl.patching.fused_head`.
"""

from __future__ import annotations

import functools

from slimrl.patching.config_fields import config_patches
from slimrl.patching.generation import (
    apply_engine_defaults,
    engine_metrics_step_factory,
    slimrl_vllm_generation_factory,
)
from slimrl.patching.grpo import logps_and_entropies_through_ops
from slimrl.patching.guards import finite_step_factory
from slimrl.patching.legacy import bound_inputs, legacy_trainer_init_factory
from slimrl.patching.registry import Patch, register

TRAINER = "trl.trainer.rloo_trainer:RLOOTrainer"
CONFIG = "trl.trainer.rloo_config:RLOOConfig"
MODULE = "trl.trainer.rloo_trainer"


def slimrl_rloo_get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                                  batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                                  **multimodal):
    """Completion log-probs ``[B, C]`` (and entropies) under ``logits / self.temperature`` via :mod:`slimrl.ops`."""
    return logps_and_entropies_through_ops(TRAINER, self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size, compute_entropy, compute_aux_loss, **multimodal)


def slimrl_rloo_init_factory(orig_init):
    """``RLOOTrainer.__init__`` with legacy keywords and checks (:func:`legacy_trainer_init_factory`), and
    ``use_vllm`` on when the model carries a fast_inference engine (:func:`apply_engine_defaults`)."""
    checked_init = legacy_trainer_init_factory(orig_init)

    @functools.wraps(orig_init)
    def slimrl_rloo_init(self, *args, **kwargs):
        bound = bound_inputs(orig_init, args, kwargs)
        apply_engine_defaults(bound.get("model"), bound.get("args"))
        checked_init(self, *args, **kwargs)

    return slimrl_rloo_init


def slimrl_rloo_training_step_factory(orig_step):
    """``RLOOTrainer.training_step`` with the NaN/inf stop (:func:`finite_step_factory`) and the engine's metrics
    (:func:`engine_metrics_step_factory`)."""
    return engine_metrics_step_factory(finite_step_factory(orig_step))


PATCHES = [
    register(Patch("rloo", TRAINER, "_get_per_token_logps_and_entropies",
                   slimrl_rloo_get_per_token_logps_and_entropies, versions="<1.15")),
    register(Patch("rloo", TRAINER, "__init__", slimrl_rloo_init_factory, wrap=True)),
    register(Patch("rloo", MODULE, "VLLMGeneration", slimrl_vllm_generation_factory, wrap=True, optional=True)),
    register(Patch("rloo", TRAINER, "training_step", slimrl_rloo_training_step_factory, wrap=True)),
    *(register(p) for p in config_patches("rloo", CONFIG)),
]
