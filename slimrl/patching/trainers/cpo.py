"""Patches for TRL's ``CPOTrainer`` (``trl.experimental.cpo``; the same code in TRL 1.12 and 1.16).

CPO (Xu et al. 2024, https://huggingface.co/papers/2401.08417): ``L = L_pref + cpo_alpha * NLL(chosen)``, with
``L_pref`` one of TRL's ``sigmoid``, ``hinge``, ``ipo``, ``simpo`` (SimPO, Meng et al. 2024,
https://huggingface.co/papers/2405.14734: length-averaged log-probs and a target margin) or ``alphapo`` (run as
``simpo`` with ``alpha``). ``cpo_loss`` and ``get_batch_loss_metrics`` stay TRL's; only the forward that feeds them
changes (:mod:`slimrl.patching.routes.score_positions`).
"""

from __future__ import annotations

from slimrl.patching.machinery.registry import Patch, original
from slimrl.patching.routes.score_positions import ROUTE as POSITIONS
from slimrl.patching.routes.score_positions import ConcatenatedSpec, concatenated_forward_through_ops
from slimrl.patching.spec import PAIRED, About, TrainerSpec
from slimrl.planning.settings import Workload

TRAINER = "trl.experimental.cpo.cpo_trainer:CPOTrainer"
CONFIG = "trl.experimental.cpo.cpo_config:CPOConfig"
# what one step does, for `slimrl plan`
WORKLOAD = Workload(generates=False, paired=True, reference="never", entropy=False)

CPO_SPEC = ConcatenatedSpec(
    padding_value=lambda trainer: trainer.pad_token_id,
    # the NLL term reads the completion labels of the chosen rows, and is a constant 0 when cpo_alpha == 0
    nll_labels=lambda trainer, cat: None if trainer.cpo_alpha == 0 else cat["concatenated_labels"],
    average_log_prob=lambda trainer: trainer.loss_type in ("ipo", "simpo"),
    logits_drop_last=False,
)


def slimrl_cpo_concatenated_forward(self, model, batch):
    """TRL's ``CPOTrainer.concatenated_forward`` without the ``[2B, T, V]`` logits (same outputs)."""
    return concatenated_forward_through_ops(self, model, batch, CPO_SPEC, original(TRAINER, "concatenated_forward"))


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): every weight trained on 4 preference pairs,
    with the NLL term."""
    args = kit.config(per_device_train_batch_size=4, max_length=64, loss_type=loss_type, cpo_alpha=0.5)
    return kit.trainer(model=kit.model(), args=args, train_dataset=kit.pairs())


PATCHES = [
    Patch("cpo", TRAINER, "concatenated_forward", slimrl_cpo_concatenated_forward),
]


SPEC = TrainerSpec(
    "cpo",
    TRAINER,
    CONFIG,
    preference=True,
    instead="DPOTrainer without a reference model",
    layouts=PAIRED,
    routes=(POSITIONS(),),
    workload=WORKLOAD,
    patches=tuple(PATCHES),
    about=About(
        note="`concatenated_forward` without the `[2B, T, V]` logits: " + POSITIONS.summary,
        parity_test="every CPO loss type (5), `tests/patching/routes/test_score_positions.py`",
        cli="paired",
        scenario=scenario,
        loss_types="config",
    ),
)
