"""GRPO (Shao et al. 2024, DeepSeekMath, https://huggingface.co/papers/2402.03300): group-relative advantages
``A_i = (r_i - mean(r)) / std(r)`` over ``num_generations`` completions of a prompt, a PPO-style clipped ratio and an
optional KL to the reference. The loss itself stays TRL's ``_compute_loss`` (every ``loss_type`` of the installed
release: grpo, bnpo, dr_grpo, dapo, cispo, luspo, sapo, vespo in 1.16), fed with log-probs from the method-capture
route (:mod:`slimrl.patching.routes.method_capture`).

What only GRPO gets (the shared patches come from :mod:`slimrl.patching.specs`): the log-prob method, the step
metrics (``memory/peak_mb``, ``tokens_per_s``), the model switched to inference mode for generation, and the
fast_inference engine in place of TRL's ``VLLMGeneration``, and the vLLM importance-sampling correction without
TRL's extra no-grad pass where it equals the policy forward (:mod:`slimrl.patching.old_logps`).
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager

import torch

from slimrl.compat.malloc import recycling_phase
from slimrl.compat.memory import peak_window
from slimrl.models.modes import for_inference, for_training
from slimrl.patching import oom
from slimrl.patching.config_fields import ALL_FIELDS, config_init_factory, generation_config_checks
from slimrl.patching.engine_hooks import log_engine_metrics, slimrl_vllm_generation_factory
from slimrl.patching.longest_first import generate_longest_first_factory
from slimrl.patching.old_logps import compute_loss_factory, fill_importance_ratio, generate_and_score_factory
from slimrl.patching.oom import logps_with_recovery
from slimrl.patching.registry import Patch
from slimrl.patching.routes.method_capture import logps_and_entropies_through_ops
from slimrl.patching.state import trainer_state
from slimrl.patching.steps import training_step_factory

TRAINER = "trl.trainer.grpo_trainer:GRPOTrainer"
CONFIG = "trl.trainer.grpo_config:GRPOConfig"
MODULE = "trl.trainer.grpo_trainer"


def grpo_config_init_factory(orig_init, fields=ALL_FIELDS):
    """``GRPOConfig.__init__``: slimrl's fields, the generation checks (temperature, completion length, batch vs
    ``num_generations``, ``unsloth_grpo_mini_batch``) and ``vllm_sampling_params`` kept as an attribute."""
    return config_init_factory(orig_init, check=generation_config_checks, extra_attributes=("vllm_sampling_params",),
                               fields=fields)


def slimrl_get_per_token_logps_and_entropies(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                                             logits_to_keep: int, batch_size: int | None = None,
                                             compute_entropy: bool = False, compute_aux_loss: bool = False,
                                             **multimodal) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """TRL's method through the method-capture route: log-probs ``[B, C]`` (and entropies ``[B, C]``); the policy's
    call also fills the vLLM IS ratio where the old-log-prob pass was skipped (:mod:`slimrl.patching.old_logps`).
    An out-of-memory pass is split in row slices (:mod:`slimrl.patching.oom`)."""
    def compute(ids: torch.Tensor, mask: torch.Tensor, rows: int | None) -> tuple:
        return logps_and_entropies_through_ops(TRAINER, self, model, ids, mask, logits_to_keep, rows,
                                               compute_entropy, compute_aux_loss, **multimodal)

    if any(v is not None for v in multimodal.values()):  # vision-language rows: not split
        out = compute(input_ids, attention_mask, batch_size)
    else:
        out = logps_with_recovery(self, compute, input_ids, attention_mask, batch_size, compute_entropy)
    fill_importance_ratio(self, out[0])
    return out


def grpo_step_metrics_factory(orig_training_step):
    """``training_step`` plus ``memory/peak_mb`` (the step's peak, generation included, through
    :func:`slimrl.compat.memory.peak_window`, which the engine's own resets cannot shorten) and ``tokens_per_s``
    (completion tokens trained / step wall time, generation included), and the engine's metrics."""

    @functools.wraps(orig_training_step)
    def slimrl_grpo_step_metrics(self, model, inputs, *args, **kwargs):
        trainer_state(self).trained_tokens = 0
        t0 = time.perf_counter()
        with peak_window(self.accelerator.device) as window, oom.step(self):
            out = orig_training_step(self, model, inputs, *args, **kwargs)
        dt = time.perf_counter() - t0
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["memory/peak_mb"].append(window.peak_bytes() / 2**20)
        self._metrics[mode]["tokens_per_s"].append(trainer_state(self).trained_tokens / dt if dt > 0 else 0.0)
        log_engine_metrics(self)
        return out

    return slimrl_grpo_step_metrics


def grpo_training_step_factory(orig_training_step):
    """The shared step (:func:`slimrl.patching.steps.training_step_factory`: NaN/inf stop, fp16 skip count)
    around GRPO's metrics (:func:`grpo_step_metrics_factory`)."""
    return training_step_factory(grpo_step_metrics_factory(orig_training_step))


def slimrl_unwrap_for_generation_factory(orig_cm):
    """TRL's ``unwrap_model_for_generation`` (as imported by the GRPO trainer module) with the model switched by
    ``FastLanguageModel.for_inference`` for the generation and back by ``for_training`` (exactly), inside
    :func:`slimrl.compat.malloc.recycling_phase` (host allocator set for the KV cache's growth)."""

    @contextmanager
    @functools.wraps(orig_cm)
    def slimrl_unwrap_model_for_generation(*args, **kwargs):
        with recycling_phase(), orig_cm(*args, **kwargs) as unwrapped:
            for_inference(unwrapped)
            try:
                yield unwrapped
            finally:
                for_training(unwrapped)

    return slimrl_unwrap_model_for_generation


def grpo_generate_and_score_factory(orig):
    """``_generate_and_score_completions``: the first training generation at full length with
    ``slimrl_longest_first`` (:mod:`slimrl.patching.longest_first`), without the old-log-prob pass where the policy
    forward gives it (:mod:`slimrl.patching.old_logps`)."""
    return generate_longest_first_factory(generate_and_score_factory(orig))


PATCHES = [
    Patch("grpo", TRAINER, "_get_per_token_logps_and_entropies", slimrl_get_per_token_logps_and_entropies),
    Patch("grpo", MODULE, "unwrap_model_for_generation", slimrl_unwrap_for_generation_factory, wrap=True),
    Patch("grpo", MODULE, "VLLMGeneration", slimrl_vllm_generation_factory, wrap=True, optional=True),
    Patch("grpo", TRAINER, "_generate_and_score_completions", grpo_generate_and_score_factory, wrap=True),
    Patch("grpo", TRAINER, "_compute_loss", compute_loss_factory, wrap=True),
]
