"""Patches for TRL's ``ORPOTrainer`` (``trl.experimental.orpo``; the same code in TRL 1.12 and 1.16).

ORPO (Hong et al. 2024, https://huggingface.co/papers/2403.07691):
``L = NLL(chosen) - mean(beta * log sigmoid(log_odds))``, ``log_odds = (lp_c - lp_r) - (log1p(-e^lp_c) -
log1p(-e^lp_r))`` with ``lp`` the *average* completion log-prob. TRL's ``odds_ratio_loss`` and
``get_batch_loss_metrics`` stay TRL's; only the forward that feeds them changes
(:mod:`slimrl.patching.routes.score_positions`).
"""

from __future__ import annotations

import torch

from slimrl.patching.machinery.registry import Patch, original
from slimrl.patching.routes.score_positions import ROUTE as POSITIONS
from slimrl.patching.routes.score_positions import ConcatenatedSpec, concatenated_forward_through_ops
from slimrl.patching.spec import PAIRED, About, TrainerSpec
from slimrl.planning.settings import Workload

TRAINER = "trl.experimental.orpo.orpo_trainer:ORPOTrainer"
CONFIG = "trl.experimental.orpo.orpo_config:ORPOConfig"
# what one step does, for `slimrl plan`
WORKLOAD = Workload(generates=False, paired=True, reference="never", entropy=False)


def _orpo_nll_labels(trainer, cat: dict) -> torch.Tensor:
    """ORPO's NLL runs over prompt and response: every attended token of the chosen rows."""
    ids, mask = cat["concatenated_input_ids"], cat["concatenated_attention_mask"]
    return torch.where(mask == 1, ids, -100)


ORPO_SPEC = ConcatenatedSpec(
    padding_value=lambda trainer: trainer.padding_value,
    nll_labels=_orpo_nll_labels,
    average_log_prob=lambda trainer: True,
    logits_drop_last=True,
)


def slimrl_orpo_concatenated_forward(self, model, batch):
    """TRL's ``ORPOTrainer.concatenated_forward`` without the ``[2B, T, V]`` logits (same outputs)."""
    return concatenated_forward_through_ops(self, model, batch, ORPO_SPEC, original(TRAINER, "concatenated_forward"))


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): every weight trained on 4 preference
    pairs."""
    args = kit.config(per_device_train_batch_size=4, max_length=64, beta=0.2)
    return kit.trainer(model=kit.model(), args=args, train_dataset=kit.pairs())


PATCHES = [
    Patch("orpo", TRAINER, "concatenated_forward", slimrl_orpo_concatenated_forward),
]


SPEC = TrainerSpec(
    "orpo",
    TRAINER,
    CONFIG,
    preference=True,
    instead="DPOTrainer with loss_type=['sigmoid', 'sft'] (a preference loss plus the SFT term)",
    layouts=PAIRED,
    routes=(POSITIONS(),),
    workload=WORKLOAD,
    patches=tuple(PATCHES),
    about=About(
        note="`concatenated_forward` without the `[2B, T, V]` logits: " + POSITIONS.summary,
        parity_test="full and LoRA, `tests/patching/routes/test_score_positions.py`",
        cli="paired",
        scenario=scenario,
    ),
)
