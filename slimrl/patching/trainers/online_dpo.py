"""Patches for TRL's ``OnlineDPOTrainer`` (``trl.experimental.online_dpo``; TRL 1.12 and 1.16).

Online DPO (Guo et al. 2024, https://huggingface.co/papers/2402.04792) samples two completions per prompt, ranks
them with a judge or reward model and applies the DPO loss to the pair. TRL's ``_forward`` computes the per-token
log-probs of the completions from ``output.logits.log_softmax(-1)``: a ``[B, P + C, V]`` logits tensor plus its
fp32 log-softmax, for the policy (with gradient) and the reference. The replacement captures the LM head's input
and projects the completion positions through :func:`slimrl.ops.chunked_logprobs` in row blocks. Like TRL, it
returns log-probs at *every* completion position, padding included (TRL's entropy metric reads them unmasked).

Delegates to TRL's ``_forward`` for vision inputs, an empty prompt, and heads that are not a plain ``nn.Linear``.

TRL's ``_generate`` (transformers' ``generate``) runs in malloc's recycling phase on a CPU
(:func:`slimrl.compat.runtime.malloc.recycling_phase`), as GRPO's generation does: with slimrl's lean mmap threshold
the KV cache's growth would page-fault afresh every token (measured: 10-18 CPU-seconds more in the first step of a
SmolLM2-135M run, docs/BENCHMARKS.md).
"""

from __future__ import annotations

import functools

import torch

from slimrl.compat.runtime.malloc import recycling_phase
from slimrl.patching.machinery.registry import Patch, original
from slimrl.patching.routes.score_positions import ROUTE as POSITIONS
from slimrl.patching.routes.score_positions import score_positions, servable_head
from slimrl.patching.spec import PROMPT, About, TrainerSpec

TRAINER = "trl.experimental.online_dpo.online_dpo_trainer:OnlineDPOTrainer"


def slimrl_online_dpo_forward(
    self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision_inputs=None
):
    """TRL's ``_forward``: log-probs ``[B, C]`` of ``completion_ids`` after the (left-truncated) prompt."""
    head = servable_head(self, model)
    truncate = max(prompt_ids.size(1) + completion_ids.size(1) - self.max_length, 0)
    if head is None or vision_inputs is not None or prompt_ids.size(1) - truncate <= 0:
        return original(TRAINER, "_forward")(
            self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, vision_inputs
        )
    prompt_ids, prompt_mask = prompt_ids[:, truncate:], prompt_mask[:, truncate:]  # same truncation as TRL
    ids = torch.cat((prompt_ids, completion_ids), dim=1)  # [B, P + C]
    mask = torch.cat((prompt_mask, completion_mask), dim=1)  # [B, P + C]
    p = prompt_ids.size(1)
    targets = torch.zeros_like(ids)  # [B, P + C]
    targets[:, p - 1 : -1] = completion_ids  # position t predicts token t + 1
    score = torch.zeros_like(ids, dtype=torch.bool)
    score[:, p - 1 : -1] = True  # every completion position, padding included (as TRL)
    logps, _, _ = score_positions(self, model, head, ids, mask, targets, score)  # [B, P + C]
    return logps[:, p - 1 : -1]  # [B, C]


def online_dpo_generate_factory(orig):
    """TRL's ``_generate`` in malloc's recycling phase (module docstring); the same call and result."""

    @functools.wraps(orig)
    def slimrl_online_dpo_generate(self, *args, **kwargs):
        with recycling_phase():
            return orig(self, *args, **kwargs)

    return slimrl_online_dpo_generate


CONFIG = "trl.experimental.online_dpo.online_dpo_config:OnlineDPOConfig"


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): a LoRA policy, 2 prompts per step, 8 new
    tokens, judged by a digits reward."""
    args = kit.config(per_device_train_batch_size=2, max_new_tokens=8, max_length=64, loss_type=loss_type)
    return kit.trainer(
        model=kit.model(lora=True), reward_funcs=[kit.digits_reward], args=args, train_dataset=kit.prompts()
    )


PATCHES = [
    Patch("online_dpo", TRAINER, "_forward", slimrl_online_dpo_forward),
    Patch("online_dpo", TRAINER, "_generate", online_dpo_generate_factory, wrap=True),
]


SPEC = TrainerSpec(
    "online_dpo",
    TRAINER,
    CONFIG,
    instead="GRPOTrainer or RLOOTrainer (online, reward-driven)",
    layouts=PROMPT,
    routes=(POSITIONS(),),
    patches=tuple(PATCHES),
    about=About(
        note="`_forward`: " + POSITIONS.summary,
        parity_test="two training steps, `tests/patching/routes/test_score_positions.py`",
        scenario=scenario,
        loss_types="config",
    ),
)
