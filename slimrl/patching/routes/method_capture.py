"""The method-capture route: a trainer's ``_get_per_token_logps_and_entropies`` answered through :mod:`slimrl.ops`.

Serves GRPO (every supported TRL) and RLOO before TRL 1.15, whose methods share one contract (all three call sites:
policy with grad on the wrapped model; old and reference no-grad passes with ``batch_size`` rows): log-probs
``[B, C]`` of the completion tokens under ``softmax(logits / self.temperature)`` with the model's logit scaling and
soft-capping, 0 at padding, and the entropies ``[B, C]`` (with gradient, for TRL's entropy bonus) when asked. The
wrapped model is called (DDP/accelerate hooks run) with ``logits_to_keep = C + 1``; its LM head input is captured
and projected chunk by chunk, only at real completion positions, so ``[B, C, V]`` logits never exist. The rows of
a call run in length groups (:func:`length_groups`): sorted by completion length and cut into forwards within a
token budget, each forward cut after its group's longest completion, so padding is not computed (TRL pads every
row to the batch's longest completion); the results return in the caller's row order, so TRL's loss and its
normalisation see the same tensors.

Cases the capture cannot serve go to the trainer's own method: vision-language inputs, MoE aux loss, and heads
that are not a plain ``nn.Linear`` (LoRA on the head, ZeRO-3 partitioned, quantized).
"""

from __future__ import annotations

from contextlib import nullcontext
from contextvars import ContextVar

import torch

from slimrl.compat.heads import capture_head_input, plain_linear_head
from slimrl.compat.host_transfer import to_device
from slimrl.compat.runtime.malloc import recycling_phase
from slimrl.patching.every_trainer.extra_fields import CHUNK_FIELDS, fields_of
from slimrl.patching.every_trainer.state import trainer_state
from slimrl.patching.every_trainer.validation import check_batch_length
from slimrl.patching.machinery.registry import original
from slimrl.patching.routes import shared_prefix
from slimrl.patching.routes.call_rows import CallRows
from slimrl.patching.routes.head import Head
from slimrl.patching.spec import Route

ROUTE = Route(
    "method capture",
    "`_get_per_token_logps_and_entropies` through `slimrl.ops` (routes/method_capture.py)",
    fields=CHUNK_FIELDS,
)


def _has_extra_inputs(kwargs: dict) -> bool:
    return any(v is not None for v in kwargs.values())


def logps_and_entropies_through_ops(
    target: str,
    self,
    model,
    input_ids,
    attention_mask,
    logits_to_keep,
    batch_size=None,
    compute_entropy=False,
    compute_aux_loss=False,
    **multimodal,
):
    """``_get_per_token_logps_and_entropies`` of any trainer with TRL's GRPO contract (see the module docstring);
    ``target`` names the class whose original method serves the cases the capture cannot."""
    captured = _capturable(self, model, compute_aux_loss, multimodal)
    if captured is None:
        fn = original(target, "_get_per_token_logps_and_entropies")
        return fn(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss,
            **multimodal,
        )
    unwrapped, head = captured
    with no_grad_phase():
        return _logps_through_ops(
            self, model, unwrapped.config, head, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy
        )


def _capturable(self, model, compute_aux_loss: bool, multimodal: dict) -> tuple | None:
    """(the unwrapped model, its plain LM head) when the capture can serve the call, else None (module docstring:
    vision-language inputs, MoE aux loss, a head that is not a plain ``nn.Linear``)."""
    unwrapped = self.accelerator.unwrap_model(model)
    head = plain_linear_head(unwrapped)
    if head is None or compute_aux_loss or _has_extra_inputs(multimodal):
        return None
    return unwrapped, head


def no_grad_phase():
    """Around a log-prob pass: :func:`slimrl.compat.runtime.malloc.recycling_phase` when it runs without gradient (old /
    reference log-probs keep nothing alive between layers: malloc may recycle blocks), nothing otherwise."""
    return nullcontext() if torch.is_grad_enabled() else recycling_phase()


# At least this many forwards per log-prob pass: `slimrl verify` sets it, since a tiny run's batch fits one forward
# and a bug past the first micro-batch would pass there
MIN_FORWARDS: ContextVar[int] = ContextVar("slimrl_min_forwards", default=1)


def rows_per_forward(args, rows: int) -> int:
    """``rows`` per forward, cut to ``unsloth_grpo_mini_batch`` in the no-grad passes (fewer rows per forward, a
    lower activation peak)."""
    mini = fields_of(args).unsloth_grpo_mini_batch
    out = min(rows, mini) if mini and not torch.is_grad_enabled() else rows
    parts = MIN_FORWARDS.get()
    return max(1, min(out, -(-rows // parts))) if parts > 1 else out


FORWARD_COST_TOKENS = {"cpu": 16, "cuda": 4096}  # a forward's fixed cost, in tokens' worth of compute


def length_groups(lengths: list[int], prompt_width: int, budget: int, forward_cost: int) -> list[list[int]]:
    """Rows cut into forwards by completion length: rows sorted longest first, consecutive runs as groups, chosen
    (dynamic programme over the sorted order) to minimise ``sum_g n_g * (P + C_g) + forward_cost * G`` (the padded
    tokens computed plus a fixed cost per forward) with ``n_g * (P + C_g) <= budget`` tokens per forward (a single
    row is always allowed). ``C_g`` is the group's longest completion: the columns after it are padding for every
    row of the group and are cut, which is exact for a causal model (no real token attends to later positions)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    width = [prompt_width + max(lengths[i], 1) for i in order]  # the group's padded width if row i leads it
    n = len(order)
    if n > 256:  # greedy beyond that: the programme is O(n^2) in Python
        groups, start = [], 0
        for j in range(1, n + 1):
            if j == n or (j + 1 - start) * width[start] > budget:
                groups.append(order[start:j])
                start = j
        return groups
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j - 1, -1, -1):  # group = sorted rows i..j-1, led (widest) by row i
            if j - i > 1 and (j - i) * width[i] > budget:
                break
            cost = best[i] + (j - i) * width[i] + forward_cost
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def _groups_for(self, rows: CallRows, batch_size: int) -> list[tuple[list[int], int]]:
    """The forwards of one call as (rows, completion columns kept): TRL's fixed row batches at the full width, or
    (``slimrl_length_groups``, default) length groups within ``slimrl_token_budget`` tokens per forward (default:
    TRL's own ``batch_size`` rows x padded width), each cut after its longest completion."""
    attention_mask, logits_to_keep = rows.attention_mask, rows.logits_to_keep
    n = attention_mask.size(0)
    if not fields_of(self.args).slimrl_length_groups:
        return [(list(range(s, min(s + batch_size, n))), logits_to_keep) for s in range(0, n, batch_size)]
    lengths = rows.facts.lengths
    prompt_width = attention_mask.size(1) - logits_to_keep
    budget = fields_of(self.args).slimrl_token_budget or batch_size * attention_mask.size(1)
    cost = FORWARD_COST_TOKENS.get(attention_mask.device.type, FORWARD_COST_TOKENS["cuda"])
    return [(g, max(1, max(lengths[i] for i in g))) for g in length_groups(lengths, prompt_width, budget, cost)]


def _packed(self, model, config, head, projection, rows: CallRows, batch_size, compute_entropy) -> tuple | None:
    """The call through the shared-prefix layout (:mod:`slimrl.patching.routes.shared_prefix`), None where it does
    not apply; ``batch_size`` (already cut to ``unsloth_grpo_mini_batch``) sets the token budget per forward."""
    groups = shared_prefix.shared_prompts(self, config, rows)
    if groups is None:
        return None
    budget = fields_of(self.args).slimrl_token_budget or batch_size * rows.attention_mask.size(1)
    return shared_prefix.logps_shared_prefix(
        self, model, head, projection, rows.input_ids, groups, rows.facts, rows.logits_to_keep, budget, compute_entropy
    )


def logps_shared_prefix_only(
    self,
    model,
    input_ids,
    attention_mask,
    logits_to_keep,
    batch_size=None,
    compute_entropy=False,
    compute_aux_loss=False,
    **multimodal,
) -> tuple | None:
    """The shared-prefix layout alone, for a trainer whose other calls keep TRL's own method (RLOO from TRL 1.15,
    whose method runs TRL's fused head): the method's result, or None where the layout does not apply (the same
    cases as :func:`logps_and_entropies_through_ops`' fallback, plus every call the layout itself declines)."""
    captured = _capturable(self, model, compute_aux_loss, multimodal)
    if captured is None:
        return None
    unwrapped, head = captured
    rows = rows_per_forward(self.args, batch_size or input_ids.size(0))
    with no_grad_phase():
        return _packed(
            self,
            model,
            unwrapped.config,
            head,
            Head.of(head, unwrapped.config, self.args),
            CallRows(input_ids, attention_mask, logits_to_keep),
            rows,
            compute_entropy,
        )


def _logps_through_ops(
    self, model, config, head, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy
):
    """The capture + :mod:`slimrl.ops` path of :func:`logps_and_entropies_through_ops`, one forward per row group
    (:func:`_groups_for`); the results are put back in the caller's row order, 0 at the cut padding."""
    check_batch_length(self.model, input_ids.size(1))
    projection = Head.of(head, config, self.args)
    batch_size = rows_per_forward(self.args, batch_size or input_ids.size(0))
    call = CallRows(input_ids, attention_mask, logits_to_keep)
    packed = _packed(self, model, config, head, projection, call, batch_size, compute_entropy)
    if packed is not None:
        return packed
    prompt_width = input_ids.size(1) - logits_to_keep
    all_logps, all_entropies, order = [], [], []
    for rows, keep in _groups_for(self, call, batch_size):
        index = to_device(rows, input_ids.device)
        ids = input_ids[index, : prompt_width + keep]  # [b, P + C_g]
        mask = attention_mask[index, : prompt_width + keep]  # [b, P + C_g]
        with capture_head_input(head) as captured, self.accelerator.autocast():
            model(input_ids=ids, attention_mask=mask, logits_to_keep=keep + 1, use_cache=False)
        hidden = captured[-1][:, :-1]  # [b, C_g, H]: position t predicts token t + 1
        targets = ids[:, -keep:]  # [b, C_g]
        valid = mask[:, -keep:].bool()  # [b, C_g]
        logps, entropy = projection.masked(hidden, targets, valid, self.temperature, compute_entropy)  # [b, C_g]
        pad = logits_to_keep - keep
        all_logps.append(torch.nn.functional.pad(logps, (0, pad)))  # [b, C]
        if compute_entropy:
            all_entropies.append(torch.nn.functional.pad(entropy, (0, pad)))  # [b, C]
        order.extend(rows)
        state = trainer_state(self)
        state.served_calls += 1
        if torch.is_grad_enabled():
            # the real tokens the host has read already, else one sync per forward
            state.trained_tokens += sum(call.facts.ones[i] for i in rows) if call.read else int(valid.sum())
    back = torch.argsort(to_device(order, input_ids.device))  # [B]: caller's row -> position in groups
    logps = torch.cat(all_logps, dim=0)[back]  # [B, C]
    entropies = torch.cat(all_entropies, dim=0)[back] if compute_entropy else None
    return logps, entropies, None
