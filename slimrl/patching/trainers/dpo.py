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

from slimrl.patching.routes.fused_head import ROUTE as FUSED
from slimrl.patching.routes.fused_head import prediction_step_patch
from slimrl.patching.spec import PAIRED, About, TrainerSpec
from slimrl.planning.settings import TrlStep, Workload

TRAINER = "trl.trainer.dpo_trainer:DPOTrainer"
CONFIG = "trl.trainer.dpo_config:DPOConfig"
# what one step does, for `slimrl plan`
WORKLOAD = Workload(
    generates=False,
    paired=True,
    reference="always",
    entropy=False,
    trl=TrlStep("dpo", holds_reference_outputs=True, default_reference=True),
)

# the log-probs come from TRL's fused head (TRL >= 1.15), whose kernel routes/fused_head.py swaps for every
# trainer on it; evaluation reads the config's chunking too


# extra config values some loss types need to be well defined
_LOSS_EXTRAS = {"robust": {"label_smoothing": 0.1}, "exo_pair": {"label_smoothing": 1e-3}}


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): every weight trained on 4 preference pairs
    against an explicit reference copy."""
    value = [loss_type] if kit.config_is_list("loss_type") else loss_type
    args = kit.config(per_device_train_batch_size=4, loss_type=value, **_LOSS_EXTRAS.get(loss_type, {}))
    return kit.trainer(model=kit.model(), ref_model=kit.model(), args=args, train_dataset=kit.pairs())


PATCHES = [prediction_step_patch("dpo", TRAINER)]


SPEC = TrainerSpec(
    "dpo",
    TRAINER,
    CONFIG,
    layouts=PAIRED,
    routes=(FUSED("_compute_loss", "compute_ref_log_probs"),),
    preference=True,
    workload=WORKLOAD,
    patches=tuple(PATCHES),
    about=About(
        note=FUSED.summary + " on TRL ≥ 1.15; on 1.12 TRL's own `_compute_loss` (full logits)",
        parity_test="every DPO loss type (15), LoRA, WPO, `tests/patching/routes/test_fused_head.py`",
        cli="paired",
        scenario=scenario,
        loss_types="config",
    ),
)
