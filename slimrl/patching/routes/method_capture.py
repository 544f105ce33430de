"""The method-capture route: a trainer's ``_get_per_token_logps_and_entropies`` answered through :mod:`slimrl.ops`.

Serves GRPO (every supported TRL) and RLOO before TRL 1.15, whose methods share one contract (all three call sites:
policy with grad on the wrapped model; old and reference no-grad passes with ``batch_size`` rows): log-probs
``[B, C]`` of the completion tokens under ``softmax(logits / self.temperature)`` with the model's logit scaling and
soft-capping, 0 at padding, and the entropies ``[B, C]`` (with gradient, for TRL's entropy bonus) when asked. The
wrapped model is called (DDP/accelerate hooks run) with ``logits_to_keep = C + 1``; its LM head input is captured
and projected chunk by chunk, only at real completion positions, so ``[B, C, V]`` logits never exist.

Cases the capture cannot serve go to the trainer's own method: vision-language inputs, MoE aux loss, and heads
that are not a plain ``nn.Linear`` (LoRA on the head, ZeRO-3 partitioned, quantized).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from slimrl.compat.heads import capture_head_input, logit_transform, plain_linear_head
from slimrl.compat.malloc import recycling_phase
from slimrl.ops.chunked_logprob import masked_token_logprobs
from slimrl.patching.registry import original
from slimrl.patching.validation import check_batch_length


def _has_extra_inputs(kwargs: dict) -> bool:
    return any(v is not None for v in kwargs.values())


def logps_and_entropies_through_ops(target: str, self, model, input_ids, attention_mask, logits_to_keep,
                                    batch_size=None, compute_entropy=False, compute_aux_loss=False, **multimodal):
    """``_get_per_token_logps_and_entropies`` of any trainer with TRL's GRPO contract (see the module docstring);
    ``target`` names the class whose original method serves the cases the capture cannot."""
    unwrapped = self.accelerator.unwrap_model(model)
    head = plain_linear_head(unwrapped)
    if head is None or compute_aux_loss or _has_extra_inputs(multimodal):
        fn = original(target, "_get_per_token_logps_and_entropies")
        return fn(self, model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                  compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)

    # No-grad passes (old / reference log-probs) keep nothing alive between layers: let malloc recycle blocks.
    with nullcontext() if torch.is_grad_enabled() else recycling_phase():
        return _logps_through_ops(self, model, unwrapped.config, head, input_ids, attention_mask, logits_to_keep,
                                  batch_size, compute_entropy)


def _logps_through_ops(self, model, config, head, input_ids, attention_mask, logits_to_keep, batch_size,
                       compute_entropy):
    """The capture + :mod:`slimrl.ops` path of :func:`logps_and_entropies_through_ops`."""
    check_batch_length(self.model, input_ids.size(1))
    scale, softcap = logit_transform(config)
    num_chunks = getattr(self.args, "unsloth_num_chunks", -1)
    batch_size = batch_size or input_ids.size(0)
    mini = getattr(self.args, "unsloth_grpo_mini_batch", None)
    if mini and not torch.is_grad_enabled():  # no-grad passes: fewer rows per forward, lower activation peak
        batch_size = min(batch_size, mini)
    all_logps, all_entropies = [], []
    for start in range(0, input_ids.size(0), batch_size):
        ids = input_ids[start:start + batch_size]  # [b, P + C]
        mask = attention_mask[start:start + batch_size]  # [b, P + C]
        with capture_head_input(head) as captured, self.accelerator.autocast():
            model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1, use_cache=False)
        hidden = captured[-1][:, :-1]  # [b, C, H]: position t predicts token t + 1
        targets = ids[:, -logits_to_keep:]  # [b, C]
        valid = mask[:, -logits_to_keep:].bool()  # [b, C]
        weight, bias = head.weight, head.bias
        if hasattr(weight, "full_tensor"):  # FSDP2 DTensor
            weight = weight.full_tensor()
            bias = bias.full_tensor() if bias is not None else None
        # The head math runs in the head's dtype with fp32 softmax, outside autocast.
        autocast_off = torch.autocast(hidden.device.type, enabled=False) if hidden.device.type in ("cuda", "cpu") \
            else nullcontext()
        with autocast_off:
            logps, entropy = masked_token_logprobs(
                hidden.to(weight.dtype), weight, targets, valid, bias, self.temperature,
                num_chunks=num_chunks, chunk_multiplier=getattr(self.args, "unsloth_logit_chunk_multiplier", None),
                logit_scale=scale, softcap=softcap, with_entropy=compute_entropy,
            )
        all_logps.append(logps)
        if compute_entropy:
            all_entropies.append(entropy)
        if torch.is_grad_enabled():
            self._slimrl_trained_tokens = getattr(self, "_slimrl_trained_tokens", 0) + int(valid.sum())
    entropies = torch.cat(all_entropies, dim=0) if compute_entropy else None
    return torch.cat(all_logps, dim=0), entropies, None
