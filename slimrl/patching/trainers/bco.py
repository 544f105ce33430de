"""Patches for TRL's ``BCOTrainer`` (``trl.experimental.bco``; the last release that has it is TRL 1.13.0).

BCO (Jung et al. 2024, https://huggingface.co/papers/2404.04656): binary classifier optimisation on unpaired
(prompt, completion, label) data, ``L = -log sigmoid(beta * r_chosen - delta) - log sigmoid(-(beta * r_rejected -
delta))`` with ``r = log pi(y|x) - log pi_ref(y|x)`` and ``delta`` a running reward mean. TRL's ``forward``
computes the summed completion log-probs from full ``[B, T, V]`` logits (policy with gradient, and the reference
through the same method) and returns the logits for the ``logits/*_sum`` metrics. The replacement scores the
labelled positions through :mod:`slimrl.ops` and returns per-position logit *sums* ``[n, T]`` in place of the
logits, whose ``.nansum()`` (all TRL reads) is the metric. ``bco_loss`` and the UDM weighting stay TRL's.

Delegates to TRL's ``forward`` for encoder-decoder models and heads that are not a plain ``nn.Linear``.
"""

from __future__ import annotations

import torch

from slimrl.compat.trl_info import UNTIL_1_13
from slimrl.patching.machinery.registry import Patch, original
from slimrl.patching.routes.score_positions import ROUTE as POSITIONS
from slimrl.patching.routes.score_positions import score_positions, servable_head
from slimrl.patching.spec import About, TrainerSpec

TRAINER = "trl.experimental.bco.bco_trainer:BCOTrainer"


def slimrl_bco_forward(self, model, batch):
    """``(chosen_logps, rejected_logps, chosen_logit_sums [n_c, T], rejected_logit_sums [n_r, T][, aux_loss])``."""
    head = servable_head(self, model)
    ids, mask = batch["completion_input_ids"], batch["completion_attention_mask"]  # [B, T]
    labels = batch["completion_labels"][:, 1:]  # [B, T-1]
    valid = labels != -100
    if head is None or self.is_encoder_decoder or (labels[valid] != ids[:, 1:][valid]).any():
        return original(TRAINER, "forward")(self, model, batch)
    targets = torch.zeros_like(ids)  # [B, T]
    targets[:, :-1] = ids[:, 1:]
    grad_pos = torch.zeros_like(ids, dtype=torch.bool)
    grad_pos[:, :-1] = valid
    model_kwargs = {"output_router_logits": True} if self.aux_loss_enabled else {}
    logps, mean_logits, outputs = score_positions(
        self, model, head, ids, mask, targets, grad_pos, stat_pos=torch.ones_like(grad_pos), **model_kwargs
    )
    completion_logps = logps.sum(-1)  # [B]
    logit_sums = mean_logits * head.weight.size(0)  # [B, T]: sum over the vocabulary at each position
    if completion_logps.shape[0] != len(batch["label"]):
        raise ValueError(
            "There is a mismatch between the number of examples in this batch and the number of "
            "examples for which an output sequence was predicted."
        )
    chosen_idx = [i for i, lab in enumerate(batch["label"]) if lab is True]
    rejected_idx = [i for i, lab in enumerate(batch["label"]) if lab is False]
    out = (
        completion_logps[chosen_idx],
        completion_logps[rejected_idx],
        logit_sums[chosen_idx],
        logit_sums[rejected_idx],
    )
    return (*out, outputs.aux_loss) if self.aux_loss_enabled else out


CONFIG = "trl.experimental.bco.bco_config:BCOConfig"


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): every weight trained on 8 labelled
    completions against an explicit reference copy."""
    args = kit.config(per_device_train_batch_size=8, max_length=64)
    return kit.trainer(model=kit.model(), ref_model=kit.model(), args=args, train_dataset=kit.unpaired())


PATCHES = [
    Patch("bco", TRAINER, "forward", slimrl_bco_forward),
]


SPEC = TrainerSpec(
    "bco",
    TRAINER,
    CONFIG,
    preference=True,
    instead="DPOTrainer(loss_type='bco_pair')",
    releases=UNTIL_1_13,
    layouts=(("prompt", "completion", "label"),),
    routes=(POSITIONS(),),
    patches=tuple(PATCHES),
    about=About(
        note="`forward`: " + POSITIONS.summary,
        parity_test="`tests/patching/trainers/test_bco_and_xpo.py`",
        scenario=scenario,
    ),
)
