"""SFT: ``nll`` (mean token negative log-likelihood) or ``dft`` (Dynamic Fine-Tuning, Wu et al. 2025,
https://huggingface.co/papers/2508.05629: each token's NLL weighted by its detached probability), TRL's own code.
From TRL 1.15 the token log-probs come from TRL's fused head, whose kernel slimrl swaps (valid positions only).
TRL 1.16's ``chunked_nll`` is TRL's own chunked path and is left alone; on TRL 1.12, use ``loss_type="chunked_nll"``
(TRL's own; the default there) for the same effect.
"""

from __future__ import annotations

from slimrl.patching.every_trainer.model_lengths import sft_lengths_from_model
from slimrl.patching.every_trainer.validation import sft_layouts
from slimrl.patching.routes.fused_head import ROUTE as FUSED
from slimrl.patching.routes.fused_head import prediction_step_patch
from slimrl.patching.spec import About, TrainerSpec
from slimrl.planning.settings import TrlStep, Workload

TRAINER = "trl.trainer.sft_trainer:SFTTrainer"
CONFIG = "trl.trainer.sft_config:SFTConfig"
# what one step does, for `slimrl plan`
WORKLOAD = Workload(generates=False, reference="never", entropy=False, trl=TrlStep("sft", nll=True))

# the log-probs come from TRL's fused head (TRL >= 1.15), whose kernel routes/fused_head.py swaps for every
# trainer on it; evaluation reads the config's chunking too


def scenario(kit, loss_type: str):
    """``slimrl verify``'s run (:class:`slimrl.verify.scenarios.Kit`): every weight trained on 4 prompt/completion
    rows (the pairs' chosen answers)."""
    args = kit.config(per_device_train_batch_size=4, loss_type=loss_type)
    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in kit.PAIRS]
    return kit.trainer(model=kit.model(), args=args, train_dataset=kit.dataset(rows))


PATCHES = [prediction_step_patch("sft", TRAINER)]


SPEC = TrainerSpec(
    "sft",
    TRAINER,
    CONFIG,
    layouts=sft_layouts,
    routes=(FUSED("compute_loss"),),
    workload=WORKLOAD,
    patches=tuple(PATCHES),
    init_hooks=(sft_lengths_from_model,),
    about=About(
        note=FUSED.summary + " on TRL ≥ 1.15; `chunked_nll` stays TRL's own",
        parity_test="nll and dft, completion-only or not, `tests/patching/routes/test_fused_head.py`",
        cli="sft",
        scenario=scenario,
        loss_types="config",
    ),
)
