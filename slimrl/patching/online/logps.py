"""The ``_get_per_token_logps_and_entropies`` both online trainers get: TRL's contract (log-probs ``[B, C]`` of the
completion tokens under ``softmax(logits / temperature)``, entropies ``[B, C]`` when asked, the MoE aux loss)
answered by the method-capture route, or where TRL's fused head serves it (RLOO from TRL 1.15: slimrl swaps the
head's kernel instead) by the shared-prefix layout where it applies and TRL's own method elsewhere, with the no-grad
passes cut to ``unsloth_grpo_mini_batch`` rows; an
out-of-memory pass is split in row slices (:mod:`slimrl.patching.online.oom`), except for vision-language rows."""

from __future__ import annotations

from typing import Any

import torch

from slimrl.patching.machinery.registry import original
from slimrl.patching.online.oom import logps_with_recovery
from slimrl.patching.routes.method_capture import (
    logps_and_entropies_through_ops,
    logps_shared_prefix_only,
    no_grad_phase,
    rows_per_forward,
)


def online_logps(
    target: str,
    trainer: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    batch_size: int | None,
    compute_entropy: bool,
    compute_aux_loss: bool,
    multimodal: dict,
    through_ops: bool,
) -> tuple:
    """The method's body for the trainer class ``target`` (``"module:Class"``); ``through_ops``: the method-capture
    route (else TRL's own method, see the module docstring)."""

    def compute(ids: torch.Tensor, mask: torch.Tensor, rows: int | None) -> tuple:
        if through_ops:
            return logps_and_entropies_through_ops(
                target, trainer, model, ids, mask, logits_to_keep, rows, compute_entropy, compute_aux_loss, **multimodal
            )
        packed = logps_shared_prefix_only(
            trainer, model, ids, mask, logits_to_keep, rows, compute_entropy, compute_aux_loss, **multimodal
        )
        if packed is not None:
            return packed
        rows = rows_per_forward(trainer.args, rows or ids.size(0))
        with no_grad_phase():  # as the method-capture route does
            return original(target, "_get_per_token_logps_and_entropies")(
                trainer,
                model,
                ids,
                mask,
                logits_to_keep,
                batch_size=rows,
                compute_entropy=compute_entropy,
                compute_aux_loss=compute_aux_loss,
                **multimodal,
            )

    if any(v is not None for v in multimodal.values()):  # vision-language rows: not split
        return compute(input_ids, attention_mask, batch_size)
    return logps_with_recovery(trainer, compute, input_ids, attention_mask, batch_size, compute_entropy)
