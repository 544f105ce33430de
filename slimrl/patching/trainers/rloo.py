"""RLOO (Ahmadian et al. 2024, https://huggingface.co/papers/2402.14740): REINFORCE with the leave-one-out mean of
the other ``k - 1`` samples' rewards as baseline, PPO-clipped sequence-level ratio; the loss stays TRL's.

TRL < 1.15 computes the completion log-probs from full ``[B, C, V]`` logits in ``_get_per_token_logps_and_entropies``
(GRPO's contract), so the method-capture route serves it. From TRL 1.15 that method calls TRL's fused head, whose
kernel :mod:`slimrl.patching.routes.fused_head` swaps; the replacement then only splits the no-grad passes into
``unsloth_grpo_mini_batch`` rows and delegates to TRL's. With a fast_inference engine, TRL's ``VLLMGeneration`` is
answered by it, and the step logs the engine's metrics.
"""

from __future__ import annotations

import functools

import torch

from slimrl.patching import oom
from slimrl.patching.config_fields import ALL_FIELDS, config_init_factory, generation_config_checks
from slimrl.patching.engine_hooks import engine_metrics_step_factory, slimrl_vllm_generation_factory
from slimrl.patching.longest_first import generate_longest_first_factory
from slimrl.patching.oom import logps_with_recovery
from slimrl.patching.registry import Patch, original
from slimrl.patching.routes.fused_head import has_fused_head, prediction_step_patch
from slimrl.patching.routes.method_capture import logps_and_entropies_through_ops
from slimrl.patching.steps import training_step_factory

TRAINER = "trl.trainer.rloo_trainer:RLOOTrainer"
CONFIG = "trl.trainer.rloo_config:RLOOConfig"
MODULE = "trl.trainer.rloo_trainer"


def slimrl_rloo_get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                                  batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                                  **multimodal):
    """Completion log-probs ``[B, C]`` (and entropies) under ``logits / self.temperature``: the method-capture route
    on TRL < 1.15; on the fused head (>= 1.15), TRL's method with no-grad passes in ``unsloth_grpo_mini_batch``
    rows. An out-of-memory pass is split in row slices (:mod:`slimrl.patching.oom`)."""

    def compute(ids: torch.Tensor, mask: torch.Tensor, rows: int | None) -> tuple:
        if not has_fused_head():
            return logps_and_entropies_through_ops(TRAINER, self, model, ids, mask, logits_to_keep, rows,
                                                   compute_entropy, compute_aux_loss, **multimodal)
        mini = getattr(self.args, "unsloth_grpo_mini_batch", None)
        if mini and not torch.is_grad_enabled():
            rows = min(rows or ids.size(0), mini)
        return original(TRAINER, "_get_per_token_logps_and_entropies")(
            self, model, ids, mask, logits_to_keep, batch_size=rows, compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss, **multimodal)

    if any(v is not None for v in multimodal.values()):  # vision-language rows: not split
        return compute(input_ids, attention_mask, batch_size)
    return logps_with_recovery(self, compute, input_ids, attention_mask, batch_size, compute_entropy)


def rloo_training_step_factory(orig_step):
    """The shared step (NaN/inf stop, :func:`slimrl.patching.steps.training_step_factory`), the out-of-memory
    splits' metric (:func:`slimrl.patching.oom.step`) and the engine's metrics
    (:func:`slimrl.patching.engine_hooks.engine_metrics_step_factory`)."""
    return engine_metrics_step_factory(training_step_factory(_oom_metric_step_factory(orig_step)))


def _oom_metric_step_factory(orig_step):
    @functools.wraps(orig_step)
    def slimrl_rloo_oom_metric_step(self, *args, **kwargs):
        with oom.step(self):
            return orig_step(self, *args, **kwargs)

    return slimrl_rloo_oom_metric_step


def rloo_config_init_factory(orig_init, fields=ALL_FIELDS):
    """``RLOOConfig.__init__`` with slimrl's fields and GRPO's generation checks (temperature, completion length,
    batch vs ``num_generations``, ``unsloth_grpo_mini_batch``)."""
    return config_init_factory(orig_init, check=generation_config_checks, fields=fields)


PATCHES = [
    Patch("rloo", TRAINER, "_get_per_token_logps_and_entropies", slimrl_rloo_get_per_token_logps_and_entropies),
    Patch("rloo", MODULE, "VLLMGeneration", slimrl_vllm_generation_factory, wrap=True, optional=True),
    Patch("rloo", TRAINER, "_generate_and_score_completions", generate_longest_first_factory, wrap=True),
    prediction_step_patch("rloo", TRAINER),
]
