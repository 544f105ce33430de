"""The score-positions route: run the (wrapped) causal LM with its LM head bypassed and score only the positions a
loss reads through :mod:`slimrl.ops`. Serves ORPO and CPO (``concatenated_forward``), OnlineDPO (``_forward``), BCO
(``forward``) and XPO (``_compute_logprobs``).

:func:`score_positions` is the shared step: call the model so the backbone runs with its hooks, capture the LM
head's input instead of the logits, then project the positions a loss reads (with gradient) and, for metrics, the
positions whose mean logit TRL logs (without gradient).

:func:`concatenated_forward_through_ops` is ORPO's and CPO's ``concatenated_forward`` on top of it. TRL's ORPO
and CPO (``trl.experimental``, same code in 1.12 and 1.16) run the model on ``[chosen; rejected]`` rows, keep
``outputs.logits [2B, T, V]``, and read three things from it:

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

from slimrl.compat.heads import capture_head_input, plain_linear_head
from slimrl.patching.every_trainer.extra_fields import CHUNK_FIELDS
from slimrl.patching.every_trainer.state import trainer_state
from slimrl.patching.routes.head import Head
from slimrl.patching.spec import Route

ROUTE = Route(
    "score positions",
    "the LM head bypassed, only scored positions projected (routes/score_positions.py)",
    fields=CHUNK_FIELDS,
)


def servable_head(trainer, model) -> torch.nn.Linear | None:
    """The plain ``nn.Linear`` head of ``model`` (unwrapped from accelerate/DDP), or None when slimrl must let
    TRL's own code run (LoRA on the head, quantized or ZeRO-3 partitioned heads)."""
    return plain_linear_head(trainer.accelerator.unwrap_model(model))


def score_positions(
    trainer,
    model,
    head,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    targets: torch.Tensor,
    grad_pos: torch.Tensor,
    *,
    stat_pos: torch.Tensor | None = None,
    temperature: float = 1.0,
    **model_kwargs,
):
    """Forward ``model`` and score hidden positions.

    Shapes: ``input_ids``, ``attention_mask`` ``[B, T]``; ``targets``, ``grad_pos``, ``stat_pos`` ``[B, T]`` over
    the *hidden* positions (position t is scored against ``targets[:, t]``, i.e. callers pass the next tokens).
    Returns ``(logps [B, T]`` (0 outside ``grad_pos``), ``mean_logits [B, T]`` at ``grad_pos | stat_pos`` (0
    elsewhere) or None when ``stat_pos`` is None, ``outputs`` (the model's output object, logits empty)).
    """
    trainer_state(trainer).served_calls += 1
    config = trainer.accelerator.unwrap_model(model).config
    with capture_head_input(head) as captured:
        outputs = model(input_ids, attention_mask=attention_mask, use_cache=False, **model_kwargs)
    hidden = captured[-1]  # [B, T, H]
    projection = Head.of(head, config, trainer.args)
    want_mean = stat_pos is not None
    outs = ("log_probs", "mean_logits") if want_mean else ("log_probs",)
    logps, _, _, mean_grad, _ = projection.outputs(hidden[grad_pos], targets[grad_pos], temperature, outs)  # [N_grad]
    per_token = logps.new_zeros(grad_pos.shape).masked_scatter(grad_pos, logps)  # [B, T]
    if not want_mean:
        return per_token, None, outputs
    rest = stat_pos & ~grad_pos  # [B, T]: mean logit only
    with torch.no_grad():
        mean_rest = projection.detached().outputs(hidden.detach()[rest], targets[rest], temperature, ("mean_logits",))[
            3
        ]  # [N_rest]
    mean_logits = logps.new_zeros(grad_pos.shape).masked_scatter(grad_pos, mean_grad).masked_scatter(rest, mean_rest)
    return per_token, mean_logits, outputs


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
    cat = trainer.concatenated_inputs(
        batch, is_encoder_decoder=False, padding_value=spec.padding_value(trainer), device=trainer.accelerator.device
    )
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
        nll_full is not None and (nll_full[:, 1:][nll_mask] != next_ids[nll_mask]).any()
    ):
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
    logps, mean_logits, outputs = score_positions(
        trainer, model, head, input_ids, attention_mask, targets, grad_pos, stat_pos=metric_pos, **model_kwargs
    )
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
