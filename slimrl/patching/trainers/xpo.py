"""Patches for TRL's ``XPOTrainer`` (``trl.experimental.xpo``; the last release that has it is TRL 1.13.0).

XPO (Xie et al. 2024, https://huggingface.co/papers/2405.21046): online DPO plus an exploration bonus
``alpha * log pi(y_ref | x)`` on the reference model's completions. Each step TRL's ``_compute_logprobs`` runs four
forwards (policy and reference, on the policy's and on the reference's completions) and turns each ``[B, P + C, V]``
logits tensor into completion log-probs. The replacement scores the non-padding completion positions through
:mod:`slimrl.ops` (padding is 0, as TRL's ``masked_fill`` leaves it). The losses stay TRL's ``_compute_losses``.
"""

from __future__ import annotations

import torch

from slimrl.compat.trl_info import UNTIL_1_13
from slimrl.patching.machinery.registry import Patch, original
from slimrl.patching.routes.score_positions import ROUTE as POSITIONS
from slimrl.patching.routes.score_positions import score_positions, servable_head
from slimrl.patching.spec import PROMPT, About, TrainerSpec

TRAINER = "trl.experimental.xpo.xpo_trainer:XPOTrainer"


def _completion_logps(trainer, model, head, data: dict, context_length: int) -> torch.Tensor:
    """Log-probs ``[B, C]`` of ``data["input_ids"][:, context_length:]``; 0 at padding."""
    ids, mask = data["input_ids"], data["attention_mask"]  # [B, P + C]
    targets = torch.zeros_like(ids)
    targets[:, context_length - 1 : -1] = ids[:, context_length:]  # position t predicts token t + 1
    score = torch.zeros_like(ids, dtype=torch.bool)
    score[:, context_length - 1 : -1] = mask[:, context_length:] == 1
    logps, _, _ = score_positions(trainer, model, head, ids, mask, targets, score)
    return logps[:, context_length - 1 : -1]


def slimrl_xpo_compute_logprobs(self, model, model_data, ref_data, context_length):
    """TRL's four completion log-prob tensors ``[B, C]``: policy on policy/ref data, reference on ref/policy data."""
    head = servable_head(self, model)
    ref_head = head if self.ref_model is None else servable_head(self, self.ref_model)
    if head is None or ref_head is None or context_length < 1:
        return original(TRAINER, "_compute_logprobs")(self, model, model_data, ref_data, context_length)
    model_on_model = _completion_logps(self, model, head, model_data, context_length)
    model_on_ref = _completion_logps(self, model, head, ref_data, context_length)
    with torch.no_grad():
        if self.ref_model is None:
            with model.disable_adapter():
                ref_on_model = _completion_logps(self, model, head, model_data, context_length)
                ref_on_ref = _completion_logps(self, model, head, ref_data, context_length)
        else:
            ref_on_model = _completion_logps(self, self.ref_model, ref_head, model_data, context_length)
            ref_on_ref = _completion_logps(self, self.ref_model, ref_head, ref_data, context_length)
    return model_on_model, model_on_ref, ref_on_ref, ref_on_model


CONFIG = "trl.experimental.xpo.xpo_config:XPOConfig"


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): a LoRA policy, 2 prompts per step, 8 new
    tokens, judged by a tiny one-score reward model."""
    args = kit.config(per_device_train_batch_size=2, max_new_tokens=8, max_length=64)
    return kit.trainer(
        model=kit.model(lora=True),
        reward_funcs=kit.model(seed=5, kind="scorer"),
        args=args,
        train_dataset=kit.prompts(),
        reward_processing_classes=kit.tokenizer,
    )


PATCHES = [
    Patch("xpo", TRAINER, "_compute_logprobs", slimrl_xpo_compute_logprobs),
]


SPEC = TrainerSpec(
    "xpo",
    TRAINER,
    CONFIG,
    instead="OnlineDPOTrainer or GRPOTrainer",
    releases=UNTIL_1_13,
    layouts=PROMPT,
    routes=(POSITIONS(),),
    patches=tuple(PATCHES),
    about=About(
        note="`_compute_logprobs`: " + POSITIONS.summary,
        parity_test="two steps, `tests/patching/trainers/test_bco_and_xpo.py`",
        scenario=scenario,
    ),
)
