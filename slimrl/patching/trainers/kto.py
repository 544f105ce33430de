"""KTO (Ethayarajh et al. 2024, https://huggingface.co/papers/2402.01306): unpaired desirable/undesirable examples,
``L = w_d (1 - sigmoid(beta (r - z_ref)))`` for desirable and ``w_u (1 - sigmoid(beta (z_ref - r)))`` for
undesirable ones, ``r`` the policy/reference log-ratio and ``z_ref`` a KL estimate from mismatched pairs; TRL's own
``kto`` and ``apo_zero_unpaired`` losses. From TRL 1.15 the log-probs (policy, reference and the KL pass) come from
TRL's fused head, whose kernel slimrl swaps. TRL 1.12 reads full logits inside ``_compute_loss`` (log-probs and
metrics in one method), which slimrl leaves as TRL's.
"""

from __future__ import annotations

from slimrl.patching.routes.fused_head import ROUTE as FUSED
from slimrl.patching.routes.fused_head import prediction_step_patch
from slimrl.patching.spec import PAIRED, About, TrainerSpec
from slimrl.planning.settings import TrlStep, Workload

TRAINER = "trl.trainer.kto_trainer:KTOTrainer"
CONFIG = "trl.trainer.kto_config:KTOConfig"
# what one step does, for `slimrl plan`
WORKLOAD = Workload(
    generates=False,
    reference="always",
    entropy=False,
    trl=TrlStep("kto", kl_pass=True, holds_reference_outputs=True, metric_copies=True, default_reference=True),
)

# the log-probs come from TRL's fused head (TRL >= 1.15), whose kernel routes/fused_head.py swaps for every
# trainer on it; evaluation reads the config's chunking too


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): every weight trained on 8 labelled
    completions against an explicit reference copy."""
    args = kit.config(per_device_train_batch_size=8, loss_type=loss_type)
    return kit.trainer(model=kit.model(), ref_model=kit.model(), args=args, train_dataset=kit.unpaired())


PATCHES = [prediction_step_patch("kto", TRAINER)]


SPEC = TrainerSpec(
    "kto",
    TRAINER,
    CONFIG,
    layouts=(("prompt", "completion", "label"), *PAIRED),
    preference=True,
    workload=WORKLOAD,
    routes=(FUSED("_compute_loss", "_compute_kl_logps", "compute_ref_log_probs"),),
    patches=tuple(PATCHES),
    about=About(
        note=FUSED.summary + " on TRL ≥ 1.15; on 1.12 TRL's own",
        parity_test="both loss types, `tests/patching/routes/test_fused_head.py`",
        cli="unpaired",
        scenario=scenario,
        loss_types="config",
    ),
)
