"""GRPO (Shao et al. 2024, DeepSeekMath, https://huggingface.co/papers/2402.03300): group-relative advantages
``A_i = (r_i - mean(r)) / std(r)`` over ``num_generations`` completions of a prompt, a PPO-style clipped ratio and an
optional KL to the reference. The loss itself stays TRL's ``_compute_loss`` (every ``loss_type`` of the installed
release: grpo, bnpo, dr_grpo, dapo, cispo, luspo, sapo, vespo in 1.16), fed with log-probs from the method-capture
route (:mod:`slimrl.patching.routes.method_capture`).

What only GRPO gets (the shared patches come from :mod:`slimrl.patching.table`): the log-prob method, the step
metrics (``memory/peak_mb``, ``tokens_per_s``), the model switched to inference mode for generation, and the
fast_inference engine in place of TRL's ``VLLMGeneration``, and the vLLM importance-sampling correction without
TRL's extra no-grad pass where it equals the policy forward (:mod:`slimrl.patching.online.old_logps`).
"""

from __future__ import annotations

import functools
from contextlib import contextmanager

import torch

from slimrl.models.modes import for_inference, for_training
from slimrl.patching.every_trainer.config_fields import ALL_FIELDS, config_init_factory, generation_config_checks
from slimrl.patching.every_trainer.validation import check_sequence_budget
from slimrl.patching.machinery.registry import Patch
from slimrl.patching.online.engine_hooks import (
    apply_engine_defaults,
    slimrl_vllm_generation_factory,
    vllm_or_transformers,
)
from slimrl.patching.online.health import attach_health_monitor
from slimrl.patching.online.logps import online_logps
from slimrl.patching.online.longest_first import generate_longest_first_factory
from slimrl.patching.online.old_logps import compute_loss_factory, fill_importance_ratio, generate_and_score_factory
from slimrl.patching.online.prefill import generate_single_turn_factory
from slimrl.patching.online.step import online_training_step_factory
from slimrl.patching.routes.fused_head import ROUTE as FUSED
from slimrl.patching.routes.method_capture import ROUTE as CAPTURE
from slimrl.patching.spec import PROMPT, About, TrainerSpec
from slimrl.planning.settings import TrlStep, Workload

TRAINER = "trl.trainer.grpo_trainer:GRPOTrainer"
CONFIG = "trl.trainer.grpo_config:GRPOConfig"
# what one step does, for `slimrl plan`
WORKLOAD = Workload(generates=True, reference="beta", entropy=True, shared_prefix=True, trl=TrlStep("grpo"))
MODULE = "trl.trainer.grpo_trainer"


def grpo_config_init_factory(orig_init, fields=ALL_FIELDS, users=None):
    """``GRPOConfig.__init__``: slimrl's fields, the generation checks (temperature, completion length, batch vs
    ``num_generations``, ``unsloth_grpo_mini_batch``) and ``vllm_sampling_params`` kept as an attribute."""
    return config_init_factory(
        orig_init,
        check=generation_config_checks,
        extra_attributes=("vllm_sampling_params",),
        fields=fields,
        users=users,
    )


def slimrl_get_per_token_logps_and_entropies(
    self,
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int | None = None,
    compute_entropy: bool = False,
    compute_aux_loss: bool = False,
    **multimodal,
) -> tuple[torch.Tensor, torch.Tensor | None, None]:
    """TRL's method through the online trainers' log-prob method (:mod:`slimrl.patching.online.logps`, the
    method-capture route); the policy's call also fills the vLLM IS ratio where the old-log-prob pass was skipped
    (:mod:`slimrl.patching.online.old_logps`)."""
    out = online_logps(
        TRAINER,
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size,
        compute_entropy,
        compute_aux_loss,
        multimodal,
        through_ops=not SPEC.enters("_get_per_token_logps_and_entropies"),
    )
    fill_importance_ratio(self, out[0])
    return out


def grpo_training_step_factory(orig_training_step):
    """The online trainers' step (:mod:`slimrl.patching.online.step`) with GRPO's step metrics (``memory/peak_mb``,
    ``tokens_per_s``)."""
    return online_training_step_factory(orig_training_step, step_metrics=True)


def slimrl_unwrap_for_generation_factory(orig_cm):
    """TRL's ``unwrap_model_for_generation`` (as imported by the GRPO trainer module) with the model switched by
    ``FastLanguageModel.for_inference`` for the generation and back by ``for_training`` (exactly). (TRL enters it
    only inside ``_generate_single_turn``, whose wrap already runs in malloc's recycling phase:
    :mod:`slimrl.patching.online.prefill`.)"""

    @contextmanager
    @functools.wraps(orig_cm)
    def slimrl_unwrap_model_for_generation(*args, **kwargs):
        with orig_cm(*args, **kwargs) as unwrapped:
            for_inference(unwrapped)
            try:
                yield unwrapped
            finally:
                for_training(unwrapped)

    return slimrl_unwrap_model_for_generation


def grpo_generate_and_score_factory(orig):
    """``_generate_and_score_completions``: the first training generation at full length with
    ``slimrl_longest_first`` (:mod:`slimrl.patching.online.longest_first`), without the old-log-prob pass where the
    policy forward gives it (:mod:`slimrl.patching.online.old_logps`)."""
    return generate_longest_first_factory(generate_and_score_factory(orig))


# extra config values some loss types need to be well defined
_LOSS_EXTRAS = {"luspo": {"importance_sampling_level": "sequence"}}


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): a LoRA policy, two prompts of 2 generations
    of 8 tokens per batch (two groups: verify splits the log-prob passes into several forwards), two iterations per
    generation, a KL to the adapter-free reference, dropout off (the agentic rows are ``slimrl.verify``'s own
    scenarios)."""
    args = kit.config(
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        num_iterations=2,
        beta=0.04,
        temperature=0.9,
        loss_type=loss_type,
        disable_dropout=True,
        **_LOSS_EXTRAS.get(loss_type, {}),
    )
    return kit.trainer(
        model=kit.model(lora=True), args=args, reward_funcs=[kit.digits_reward], train_dataset=kit.prompts()
    )


PATCHES = [
    Patch("grpo", TRAINER, "_get_per_token_logps_and_entropies", slimrl_get_per_token_logps_and_entropies),
    Patch(
        "grpo", MODULE, "unwrap_model_for_generation", slimrl_unwrap_for_generation_factory, wrap=True, passthrough=True
    ),
    Patch("grpo", MODULE, "VLLMGeneration", slimrl_vllm_generation_factory, wrap=True, optional=True),
    Patch("grpo", TRAINER, "_generate_and_score_completions", grpo_generate_and_score_factory, wrap=True),
    Patch("grpo", TRAINER, "_generate_single_turn", generate_single_turn_factory, wrap=True),
    Patch("grpo", TRAINER, "_compute_loss", compute_loss_factory, wrap=True),
]


SPEC = TrainerSpec(
    "grpo",
    TRAINER,
    CONFIG,
    layouts=PROMPT,
    routes=(CAPTURE(), FUSED()),
    workload=WORKLOAD,
    fields=ALL_FIELDS,
    config_init=grpo_config_init_factory,
    init_hooks=(
        check_sequence_budget,
        apply_engine_defaults,
        functools.partial(vllm_or_transformers, trainer_module=MODULE),
    ),
    auto_fit=True,
    after_init=(attach_health_monitor,),
    training_step=grpo_training_step_factory,
    patches=tuple(PATCHES),
    about=About(
        note=CAPTURE.summary
        + "; the calls it leaves to TRL (images, MoE aux loss, a LoRA head): "
        + FUSED.summary
        + " on TRL ≥ 1.15",
        parity_test="all 8 loss types × beta, `tests/patching/trainers/test_grpo.py`; images: "
        "`tests/patching/test_vision_parity.py`",
        cli="online",
        scenario=scenario,
        loss_types="grpo",
        generation_check=True,
    ),
)
