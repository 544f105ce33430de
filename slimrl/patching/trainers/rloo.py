"""RLOO (Ahmadian et al. 2024, https://huggingface.co/papers/2402.14740): REINFORCE with the leave-one-out mean of
the other ``k - 1`` samples' rewards as baseline, PPO-clipped sequence-level ratio; the loss stays TRL's.

TRL < 1.15 computes the completion log-probs from full ``[B, C, V]`` logits in ``_get_per_token_logps_and_entropies``
(GRPO's contract), so the method-capture route serves it. From TRL 1.15 that method calls TRL's fused head, whose
kernel :mod:`slimrl.patching.routes.fused_head` swaps; the replacement runs the shared-prefix layout
(:mod:`slimrl.patching.routes.shared_prefix`) where it applies, else splits the no-grad passes into
``unsloth_grpo_mini_batch`` rows and delegates to TRL's. Generation's prefill runs once per distinct prompt (HF
``generate``, :mod:`slimrl.patching.online.prefill`). With a fast_inference engine, TRL's ``VLLMGeneration`` is
answered by it, and the step logs the engine's metrics.
"""

from __future__ import annotations

import functools

from slimrl.patching.every_trainer.config_fields import (
    ALL_FIELDS,
    ONLINE_FIELDS,
    config_init_factory,
    generation_config_checks,
)
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
from slimrl.patching.online.prefill import generate_single_turn_factory
from slimrl.patching.online.step import online_training_step_factory
from slimrl.patching.routes.fused_head import ROUTE as FUSED
from slimrl.patching.routes.fused_head import prediction_step_patch
from slimrl.patching.routes.method_capture import ROUTE as CAPTURE
from slimrl.patching.spec import PROMPT, About, TrainerSpec
from slimrl.planning.settings import TrlStep, Workload

TRAINER = "trl.trainer.rloo_trainer:RLOOTrainer"
CONFIG = "trl.trainer.rloo_config:RLOOConfig"
# what one step does, for `slimrl plan`
WORKLOAD = Workload(
    generates=True, reference="beta", entropy=False, trl=TrlStep("rloo", default_reference=True)
)  # TRL's beta defaults to 0.05
MODULE = "trl.trainer.rloo_trainer"


def slimrl_rloo_get_per_token_logps_and_entropies(
    self,
    model,
    input_ids,
    attention_mask,
    logits_to_keep,
    batch_size=None,
    compute_entropy=False,
    compute_aux_loss=False,
    **multimodal,
):
    """The online trainers' log-prob method (:mod:`slimrl.patching.online.logps`): the method-capture route on
    TRL < 1.15, TRL's fused-head method (slimrl's kernel in it) from 1.15."""
    return online_logps(
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


def rloo_training_step_factory(orig_training_step):
    """The online trainers' step (:mod:`slimrl.patching.online.step`)."""
    return online_training_step_factory(orig_training_step)


def rloo_config_init_factory(orig_init, fields=ALL_FIELDS, users=None):
    """``RLOOConfig.__init__`` with slimrl's fields and GRPO's generation checks (temperature, completion length,
    batch vs ``num_generations``, ``unsloth_grpo_mini_batch``)."""
    return config_init_factory(orig_init, check=generation_config_checks, fields=fields, users=users)


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): a LoRA policy, 4 prompts x 4 generations of
    8 tokens, two iterations per generation, a KL to the adapter-free reference."""
    args = kit.config(
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        num_iterations=2,
        beta=0.05,
        temperature=0.9,
    )
    return kit.trainer(
        model=kit.model(lora=True), args=args, reward_funcs=[kit.digits_reward], train_dataset=kit.prompts()
    )


PATCHES = [
    Patch("rloo", TRAINER, "_get_per_token_logps_and_entropies", slimrl_rloo_get_per_token_logps_and_entropies),
    Patch("rloo", MODULE, "VLLMGeneration", slimrl_vllm_generation_factory, wrap=True, optional=True),
    Patch("rloo", TRAINER, "_generate_and_score_completions", generate_longest_first_factory, wrap=True),
    Patch("rloo", TRAINER, "_generate_single_turn", generate_single_turn_factory, wrap=True),
    prediction_step_patch("rloo", TRAINER),
]


SPEC = TrainerSpec(
    "rloo",
    TRAINER,
    CONFIG,
    layouts=PROMPT,
    routes=(CAPTURE(), FUSED("_get_per_token_logps_and_entropies")),
    workload=WORKLOAD,
    fields=ONLINE_FIELDS,
    config_init=rloo_config_init_factory,
    init_hooks=(
        check_sequence_budget,
        apply_engine_defaults,
        functools.partial(vllm_or_transformers, trainer_module=MODULE),
    ),
    auto_fit=True,
    after_init=(attach_health_monitor,),
    training_step=rloo_training_step_factory,
    patches=tuple(PATCHES),
    about=About(
        note=FUSED.summary + " on TRL ≥ 1.15; " + CAPTURE.summary + " on 1.12",
        parity_test="two steps with generation, old log-probs and KL, `tests/patching/trainers/test_rloo.py`",
        cli="online",
        scenario=scenario,
        generation_check=True,
    ),
)
