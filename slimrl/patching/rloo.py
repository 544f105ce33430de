"""Patches for TRL's ``RLOOTrainer``.

| TRL attribute                                        | replaced by                                         |
|------------------------------------------------------|-----------------------------------------------------|
| ``RLOOTrainer._get_per_token_logps_and_entropies``   | :func:`slimrl_rloo_get_per_token_logps_and_entropies` |
| ``RLOOTrainer.__init__``                             | :func:`slimrl_rloo_init` (checks, engine default)    |
| ``RLOOTrainer.training_step``                        | NaN/inf stop + engine metrics                        |
| ``RLOOTrainer.prediction_step`` (TRL >= 1.15)        | evaluation with the config current (fused head)      |
| ``RLOOConfig`` fields and ``__init__``               | slimrl's fields (:mod:`slimrl.patching.config_fields`) |
| ``rloo_trainer.VLLMGeneration``                      | the model's engine (:mod:`slimrl.patching.generation`) |

RLOO (Ahmadian et al. 2024, https://huggingface.co/papers/2402.14740): REINFORCE with the leave-one-out mean of
the other ``k - 1`` samples' rewards as baseline, PPO-clipped sequence-level ratio. TRL < 1.15 computes the
completion log-probs from full ``[B, C, V]`` logits (``selective_log_softmax``) in the same method and with the same
contract as GRPO's, so the GRPO replacement (:func:`slimrl.patching.grpo.logps_and_entropies_through_ops`) serves
it. From TRL 1.15 on, that method calls TRL's fused head, whose kernel :mod:`slimrl.patching.fused_head` swaps; the
replacement then only splits the no-grad passes into ``unsloth_grpo_mini_batch`` rows and delegates to TRL's.
"""

from __future__ import annotations

import functools

import torch

from slimrl.patching.config_fields import ALL_FIELDS, config_init_factory, config_patches, generation_config_checks
from slimrl.patching.fused_head import fused_head_trainer_patches, has_fused_head
from slimrl.patching.generation import (
    apply_engine_defaults,
    engine_metrics_step_factory,
    slimrl_vllm_generation_factory,
)
from slimrl.patching.grpo import logps_and_entropies_through_ops
from slimrl.patching.legacy import bound_inputs, legacy_trainer_init_factory
from slimrl.patching.registry import Patch, original, register
from slimrl.patching.steps import training_step_factory
from slimrl.patching.validation import check_sequence_budget

TRAINER = "trl.trainer.rloo_trainer:RLOOTrainer"
CONFIG = "trl.trainer.rloo_config:RLOOConfig"
MODULE = "trl.trainer.rloo_trainer"


def slimrl_rloo_get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                                  batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                                  **multimodal):
    """Completion log-probs ``[B, C]`` (and entropies) under ``logits / self.temperature``: via :mod:`slimrl.ops`
    on TRL < 1.15; on the fused head (>= 1.15), TRL's method with no-grad passes in ``unsloth_grpo_mini_batch``
    rows."""
    if has_fused_head():
        mini = getattr(self.args, "unsloth_grpo_mini_batch", None)
        if mini and not torch.is_grad_enabled():
            batch_size = min(batch_size or input_ids.size(0), mini)
        return original(TRAINER, "_get_per_token_logps_and_entropies")(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
            compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
    return logps_and_entropies_through_ops(TRAINER, self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size, compute_entropy, compute_aux_loss, **multimodal)


def slimrl_rloo_init_factory(orig_init):
    """``RLOOTrainer.__init__`` with legacy keywords and checks (:func:`legacy_trainer_init_factory`), and
    ``use_vllm`` on when the model carries a fast_inference engine (:func:`apply_engine_defaults`)."""
    checked_init = legacy_trainer_init_factory(orig_init)

    @functools.wraps(orig_init)
    def slimrl_rloo_init(self, *args, **kwargs):
        bound = bound_inputs(orig_init, args, kwargs)
        check_sequence_budget(bound.get("model"), bound.get("args"))
        apply_engine_defaults(bound.get("model"), bound.get("args"))
        checked_init(self, *args, **kwargs)

    return slimrl_rloo_init


def slimrl_rloo_training_step_factory(orig_step):
    """``RLOOTrainer.training_step`` with the NaN/inf stop (:func:`training_step_factory`) and the engine's metrics
    (:func:`engine_metrics_step_factory`)."""
    return engine_metrics_step_factory(training_step_factory(orig_step))


def rloo_config_init_factory(orig_init, fields=ALL_FIELDS):
    """``RLOOConfig.__init__`` with slimrl's fields and GRPO's generation checks (temperature, completion length,
    batch vs ``num_generations``, ``unsloth_grpo_mini_batch``)."""
    return config_init_factory(orig_init, check=generation_config_checks, fields=fields)


PATCHES = [
    register(Patch("rloo", TRAINER, "_get_per_token_logps_and_entropies",
                   slimrl_rloo_get_per_token_logps_and_entropies)),
    *fused_head_trainer_patches("rloo", TRAINER),
    register(Patch("rloo", TRAINER, "__init__", slimrl_rloo_init_factory, wrap=True)),
    register(Patch("rloo", MODULE, "VLLMGeneration", slimrl_vllm_generation_factory, wrap=True, optional=True)),
    register(Patch("rloo", TRAINER, "training_step", slimrl_rloo_training_step_factory, wrap=True)),
    *(register(p) for p in config_patches("rloo", CONFIG, init=rloo_config_init_factory)),
]
