"""Run a causal LM without its ``[B, T, V]`` logits and score chosen positions through :mod:`slimrl.ops`.

The trainer-specific patches (ORPO, CPO, BCO, XPO, ...) all need the same step: call the (wrapped) model so the
backbone runs with its hooks, capture the LM head's input instead of the logits, then project only the positions
a loss reads (with gradient) and, for metrics, the positions whose mean logit TRL logs (without gradient).
"""

from __future__ import annotations

import torch

from slimrl.compat.heads import capture_head_input, logit_transform, plain_linear_head
from slimrl.ops.chunked_logprob import chunked_logprob_outputs


def servable_head(trainer, model) -> torch.nn.Linear | None:
    """The plain ``nn.Linear`` head of ``model`` (unwrapped from accelerate/DDP), or None when slimrl must let
    TRL's own code run (LoRA on the head, quantized or ZeRO-3 partitioned heads)."""
    return plain_linear_head(trainer.accelerator.unwrap_model(model))


def score_positions(trainer, model, head, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    targets: torch.Tensor, grad_pos: torch.Tensor, *, stat_pos: torch.Tensor | None = None,
                    temperature: float = 1.0, **model_kwargs):
    """Forward ``model`` and score hidden positions.

    Shapes: ``input_ids``, ``attention_mask`` ``[B, T]``; ``targets``, ``grad_pos``, ``stat_pos`` ``[B, T]`` over
    the *hidden* positions (position t is scored against ``targets[:, t]``, i.e. callers pass the next tokens).
    Returns ``(logps [B, T]`` (0 outside ``grad_pos``), ``mean_logits [B, T]`` at ``grad_pos | stat_pos`` (0
    elsewhere) or None when ``stat_pos`` is None, ``outputs`` (the model's output object, logits empty)).
    """
    score_positions.calls += 1
    config = trainer.accelerator.unwrap_model(model).config
    with capture_head_input(head) as captured:
        outputs = model(input_ids, attention_mask=attention_mask, use_cache=False, **model_kwargs)
    hidden = captured[-1]  # [B, T, H]
    scale, softcap = logit_transform(config)
    weight, bias = head.weight, head.bias
    chunking = {"num_chunks": getattr(trainer.args, "unsloth_num_chunks", -1),
                "chunk_multiplier": getattr(trainer.args, "unsloth_logit_chunk_multiplier", None)}
    want_mean = stat_pos is not None
    outs = ("log_probs", "mean_logits") if want_mean else ("log_probs",)
    with torch.autocast(hidden.device.type, enabled=False):
        logps, _, _, mean_grad, _ = chunked_logprob_outputs(
            hidden[grad_pos].to(weight.dtype), weight, targets[grad_pos], bias, temperature, outputs=outs,
            logit_scale=scale, softcap=softcap, **chunking)  # [N_grad]
        per_token = logps.new_zeros(grad_pos.shape).masked_scatter(grad_pos, logps)  # [B, T]
        if not want_mean:
            return per_token, None, outputs
        rest = stat_pos & ~grad_pos  # [B, T]: mean logit only
        with torch.no_grad():
            mean_rest = chunked_logprob_outputs(
                hidden.detach()[rest].to(weight.dtype), weight.detach(), targets[rest],
                None if bias is None else bias.detach(), temperature, outputs=("mean_logits",), logit_scale=scale,
                softcap=softcap, **chunking)[3]  # [N_rest]
    mean_logits = logps.new_zeros(grad_pos.shape).masked_scatter(grad_pos, mean_grad).masked_scatter(rest, mean_rest)
    return per_token, mean_logits, outputs


score_positions.calls = 0  # forwards served by slimrl's path (tests use it to prove the path ran)
