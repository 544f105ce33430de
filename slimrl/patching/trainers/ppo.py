"""Patches for TRL's ``PPOTrainer`` (``trl.experimental.ppo``; the last release that has it is TRL 1.12.0).

PPO (Schulman et al. 2017, https://huggingface.co/papers/1707.06347, with the RLHF recipe of Ouyang et al. 2022):
clipped policy ratio plus a clipped value loss, per-token KL penalty to the reference in the reward. In TRL 1.12
everything happens inside ``PPOTrainer.train``, one ~350-line loop that keeps the generation scores
``[B, C, V]``, runs the reference and the policy with full logits and reads those logits again for the entropy
metric. There is no method boundary below ``train`` that carries the log-probs, so slimrl does not replace that
path (doing so would mean rewriting TRL's loop): PPO trains as TRL does, and old PPO scripts keep working. For
memory-lean RL on one GPU use GRPO or RLOO, which slimrl patches on every supported TRL.
"""

from __future__ import annotations

from slimrl.compat.trl_info import UNTIL_1_12
from slimrl.patching.spec import CHECKS_ONLY, About, TrainerSpec

TRAINER = "trl.experimental.ppo.ppo_trainer:PPOTrainer"
CONFIG = "trl.experimental.ppo.ppo_config:PPOConfig"

PATCHES: list = []  # only the shared patches (slimrl.patching.table)


SPEC = TrainerSpec(
    "ppo",
    TRAINER,
    CONFIG,
    instead="GRPOTrainer or RLOOTrainer (no value model)",
    releases=UNTIL_1_12,
    training_step=None,
    about=About(
        note="none: TRL 1.12's PPO runs one `train()` loop over full logits; slimrl does not rewrite it; "
        "legacy keywords and checks only",
        not_verified="TRL 1.12's PPO needs a value and a reward model and slimrl leaves its loop to TRL",
        layer=CHECKS_ONLY,
    ),
)
