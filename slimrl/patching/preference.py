"""``concatenated_forward`` through :mod:`slimrl.ops` for the trainers that still build full logits (ORPO, CPO).

TRL's ORPO and CPO (``trl.experimental``, same code in 1.12 and 1.16) run the model on ``[chosen; rejected]``
rows, keep ``outputs.logits [2B, T, V]``, and read three things from it:

* the chosen rows' NLL (``nn.CrossEntropyLoss`` mean over the positions whose label is not -100),
* per-row log-probs of the completion labels, summed or averaged (``get_batch_logps``),
* the mean logit of the chosen and of the rejected rows (``logits/chosen``, ``logits/rejected`` metrics).

Here the LM head's input is captured instead (:func:`slimrl.compat.heads.capture_head_input`; the model is
called through its wrapper so DDP hooks fire), and the head is applied in row blocks: with gradient only at
positions some loss reads, without gradient (mean logit only) at the rest. Peak memory for the head drops from
``2B x T x V`` fp32 logits (plus their gradient) to one block of at most 64 MiB. The returned "logits" are the
per-position mean logits ``[B, T']``: their ``.mean()`` is the metric TRL logs (every position has V entries,
so the mean of the means is the mean of the full tensor).

Delegates to TRL's own ``concatenated_forward`` for encoder-decoder models, heads that are not a plain
``nn.Linear`` (LoRA on the head, quantized, ZeRO-3), and labels that are not the input tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from slimrl.patching.capture import score_positions, servable_head


@dataclass(frozen=True)
class ConcatenatedSpec:
    """What one trainer's ``concatenated_forward`` computes (read from TRL's code, per trainer)."""

    padding_value: Callable[[object], int]  # trainer -> pad id used by concatenated_inputs
    nll_labels: Callable[[object, dict], torch.Tensor | None]  # (trainer, concatenated batch) -> [2B, T] or None
    average_log_prob: Callable[[object], bool]  # trainer -> average (True) or sum the completion log-probs
    logits_drop_last: bool  # the returned logits are ``[:, :-1]`` (ORPO) or all T positions (CPO)


def concatenated_forward_through_ops(trainer, model, batch: dict, spec: ConcatenatedSpec, fallback: Callable):
    """Drop-in body for ``concatenated_forward``: returns ``(chosen_logps [B], rejected_logps [B], chosen_logits,
    rejected_logits, nll_loss[, aux_loss])`` like TRL, without the ``[2B, T, V]`` logits."""
    head = servable_head(trainer, model)
    if head is None or trainer.is_encoder_decoder:
        return fallback(trainer, model, batch)
    cat = trainer.concatenated_inputs(batch, is_encoder_decoder=False, padding_value=spec.padding_value(trainer),
                                      device=trainer.accelerator.device)
    input_ids, attention_mask = cat["concatenated_input_ids"], cat["concatenated_attention_mask"]  # [2B, T]
    pref_labels = cat["concatenated_labels"][:, 1:]  # [2B, T-1]
    nll_full = spec.nll_labels(trainer, cat)
    next_ids = input_ids[:, 1:]  # [2B, T-1]: position t predicts token t + 1
    n_chosen = batch["chosen_labels"].shape[0]
    pref_mask = pref_labels != -100  # [2B, T-1]
    nll_mask = torch.zeros_like(pref_mask)
    if nll_full is not None:
        nll_mask[:n_chosen] = nll_full[:n_chosen, 1:] != -100
    if (pref_labels[pref_mask] != next_ids[pref_mask]).any() or (
            nll_full is not None and (nll_full[:, 1:][nll_mask] != next_ids[nll_mask]).any()):
        return fallback(trainer, model, batch)  # labels are not the next input tokens: TRL's general path

    model_kwargs = {"output_router_logits": True} if trainer.aux_loss_enabled else {}
    rows, t = input_ids.shape
    grad_pos = torch.zeros(rows, t, dtype=torch.bool, device=input_ids.device)  # [2B, T]
    grad_pos[:, :-1] = pref_mask | nll_mask
    metric_pos = torch.ones_like(grad_pos)
    if spec.logits_drop_last:
        metric_pos[:, -1] = False
    targets = torch.zeros_like(input_ids)  # [2B, T]
    targets[:, :-1] = next_ids
    logps, mean_logits, outputs = score_positions(trainer, model, head, input_ids, attention_mask, targets,
                                                  grad_pos, stat_pos=metric_pos, **model_kwargs)
    per_token = logps[:, :-1]  # [2B, T-1]
    if spec.logits_drop_last:
        mean_logits = mean_logits[:, :-1]

    if nll_full is None:
        nll_loss = torch.tensor(0.0).to(trainer.accelerator.device)
    else:  # nn.CrossEntropyLoss(mean) over the chosen rows' labelled positions
        chosen_nll = nll_mask[:n_chosen]
        nll_loss = -(per_token[:n_chosen] * chosen_nll).sum() / chosen_nll.sum()
    all_logps = (per_token * pref_mask).sum(-1)  # [2B]
    if spec.average_log_prob(trainer):
        all_logps = all_logps / pref_mask.sum(-1)
    out = (all_logps[:n_chosen], all_logps[n_chosen:], mean_logits[:n_chosen], mean_logits[n_chosen:], nll_loss)
    if trainer.aux_loss_enabled:
        return (*out, outputs.aux_loss)
    return out
