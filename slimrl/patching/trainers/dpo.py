"""DPO (Rafailov et al. 2023, https://huggingface.co/papers/2305.18290): ``L = -log sigmoid(beta * ((lp_c - lp_ref_c)
- (lp_r - lp_ref_r)))`` and TRL's 14 other ``loss_type`` values, all TRL's own code. From TRL 1.15 on, the
policy and reference log-probs come from TRL's fused LM head, whose kernel slimrl swaps for its own on devices
without Triton (valid positions only, small row blocks; :mod:`slimrl.patching.routes.fused_head`).

TRL 1.12 computes them in ``_compute_loss``, one method that reads the full ``[2B, T, V]`` logits for the log-probs
*and* for six metrics and three loss terms (entropy, mean logits, top-1 accuracy, the ``sft`` loss, WPO weights),
so there is no boundary to replace without rewriting that method: on 1.12 DPO trains as TRL does, with only the
legacy keywords added. Use TRL >= 1.15 for the memory savings.
"""

from __future__ import annotations

from slimrl.patching.routes.fused_head import prediction_step_patch

TRAINER = "trl.trainer.dpo_trainer:DPOTrainer"
CONFIG = "trl.trainer.dpo_config:DPOConfig"

# the log-probs come from TRL's fused head (TRL >= 1.15), whose kernel routes/fused_head.py swaps for every
# trainer on it; evaluation reads the config's chunking too
PATCHES = [prediction_step_patch("dpo", TRAINER)]
