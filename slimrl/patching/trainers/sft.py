"""SFT: ``nll`` (mean token negative log-likelihood) or ``dft`` (Dynamic Fine-Tuning, Wu et al. 2025,
https://huggingface.co/papers/2508.05629: each token's NLL weighted by its detached probability), TRL's own code.
From TRL 1.15 the token log-probs come from TRL's fused head, whose kernel slimrl swaps (valid positions only).
TRL 1.16's ``chunked_nll`` is TRL's own chunked path and is left alone; on TRL 1.12, use ``loss_type="chunked_nll"``
(TRL's own; the default there) for the same effect.
"""

from __future__ import annotations

from slimrl.patching.routes.fused_head import prediction_step_patch

TRAINER = "trl.trainer.sft_trainer:SFTTrainer"
CONFIG = "trl.trainer.sft_config:SFTConfig"

# the log-probs come from TRL's fused head (TRL >= 1.15), whose kernel routes/fused_head.py swaps for every
# trainer on it; evaluation reads the config's chunking too
PATCHES = [prediction_step_patch("sft", TRAINER)]
