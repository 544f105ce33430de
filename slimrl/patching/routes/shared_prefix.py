"""The shared-prefix layout of the log-prob passes (``slimrl_shared_prefix``, default on; GRPO and RLOO).

GRPO and RLOO before TRL 1.15 reach it through the method-capture route; RLOO from 1.15 through the online log-prob
method (:mod:`slimrl.patching.online.logps`), which keeps TRL's fused head for the calls the layout declines.

In GRPO and RLOO a micro-batch holds each prompt once per completion sampled from it. Here the rows of one
log-prob call that hold the same prompt become one packed row ``[prompt, c1, ..., cG]`` (each completion cut after
its last real token); the model runs once over the packed rows with

* **position ids** of TRL's own rows (prompt tokens where TRL's left-padded row has them, each completion from the
  prompt's end again), so rotary embeddings see the same angles;
* **attention** per :mod:`slimrl.ops.prefix_attention`: the packed rows' layout rides in the 4-D ``attention_mask``
  the model is given (transformers passes a 4-D mask through to the layers unchanged) and transformers' ``sdpa``
  attention function is wrapped (:func:`slimrl_sdpa_factory`, installed with the GRPO/RLOO patches) to run the
  shared-prefix attention for such a mask and TRL's ``sdpa`` for every other call. The layout stays with the mask,
  so a gradient-checkpointed layer recomputed in the backward gets it again.

Each completion token then gets TRL's hidden state and log-prob, and the gradient reaching the prompt is the sum of
its copies' (the same parameter gradient). The LM-head input is captured at the positions that predict completion
tokens (the prompt's last position for each completion's first token) and projected through :class:`Head`.

Falls back to TRL's layout (the length groups of :mod:`slimrl.patching.routes.method_capture`), with one log line
per reason: an attention implementation other than ``sdpa``, a model family not tested with the layout, attention
soft-capping, a sliding window shorter than prompt + completion, or masks that are not one left-padded prompt then
one completion per row; on a GPU, a call where the training pass's time model says the layout costs more than it
saves (:func:`pays`: short prompts against long completions). A call where no prompt repeats runs TRL's layout
without a line (nothing to share).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import torch

from slimrl.compat.heads import capture_head_input
from slimrl.compat.host_transfer import to_device
from slimrl.ops.prefix_attention import PackedLayout, model_reason, shared_prefix_attention
from slimrl.patching.every_trainer.extra_fields import fields_of
from slimrl.patching.every_trainer.state import trainer_state
from slimrl.patching.machinery.registry import Patch
from slimrl.patching.routes.call_rows import CallRows, RowFacts
from slimrl.patching.routes.head import Head

logger = logging.getLogger("slimrl")

_SAID: set[str] = set()


def slimrl_sdpa_factory(mapping: dict) -> dict:
    """``transformers.modeling_utils.AttentionInterface._global_mapping`` with its ``sdpa`` entry wrapped: a mask
    that carries a :class:`PackedLayout` gets :func:`shared_prefix_attention`; anything else goes to the original
    function unchanged."""
    original_sdpa = mapping["sdpa"]

    def slimrl_sdpa_or_shared_prefix(module, query, key, value, attention_mask, *args, **kwargs):
        layout = getattr(attention_mask, "slimrl_layout", None)
        if layout is None:
            return original_sdpa(module, query, key, value, attention_mask, *args, **kwargs)
        out = shared_prefix_attention(
            query, key, value, layout, scaling=kwargs.get("scaling"), dropout=float(kwargs.get("dropout", 0.0))
        )  # [R, T, h, d]
        return out, None

    return {**mapping, "sdpa": slimrl_sdpa_or_shared_prefix}


def attention_patch(algorithms: tuple[str, ...]) -> Patch:
    """The ``sdpa`` wrap, installed while any of ``algorithms`` is patched."""
    return Patch(
        algorithms, "transformers.modeling_utils:AttentionInterface", "_global_mapping", slimrl_sdpa_factory, wrap=True
    )


def why_not(trainer: Any, config: Any, prompt_width: int, longest: int) -> str | None:
    """Why this call cannot take the layout (None: it can); see the module docstring."""
    from transformers.modeling_utils import AttentionInterface

    if not fields_of(trainer.args).slimrl_shared_prefix:
        return ""  # turned off: no line
    text = getattr(config, "text_config", None) or config
    impl = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)
    if impl != "sdpa":
        return f"attention implementation {impl!r} (the layout runs through transformers' 'sdpa')"
    if getattr(AttentionInterface._global_mapping.get("sdpa"), "__name__", "") != "slimrl_sdpa_or_shared_prefix":
        return "transformers' sdpa attention is not slimrl's (the patch is not installed)"
    return model_reason(config, prompt_width + longest)


def say_once(reason: str) -> None:
    if reason and reason not in _SAID:
        _SAID.add(reason)
        logger.info("slimrl: shared-prefix layout off (%s): TRL's layout, each prompt once per completion", reason)


def groups_of(facts: RowFacts) -> list[list[int]] | None:
    """Rows holding the same prompt, in first-seen order; None when a row's masks are not one left-padded prompt
    (at least one token) then one completion of ``lengths[i]`` tokens."""
    if not facts.well_formed:
        return None
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, prompt in enumerate(facts.prompts):
        groups[prompt].append(i)
    return list(groups.values())


def _forwards(packs: list[tuple[int, list[int]]], widths: list[int], budget: int) -> list[list[int]]:
    """Packed rows (by index) cut into forwards of at most ``budget`` padded tokens (one row always allowed), the
    widest first."""
    order = sorted(range(len(packs)), key=lambda i: -widths[i])
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * widths[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def logps_shared_prefix(
    trainer: Any,
    model: Any,
    head_module: torch.nn.Module,
    projection: Head,
    input_ids: torch.Tensor,
    groups: list[list[int]],
    facts: RowFacts,
    logits_to_keep: int,
    budget: int,
    compute_entropy: bool,
) -> tuple | None:
    """Log-probs ``[B, C]`` (and entropies) of the call's completions through packed rows (module docstring); None
    where no row has a completion token (the caller's path then runs, keeping the graph)."""
    rows, width = input_ids.shape
    prompt_width = width - logits_to_keep
    lengths, n_prompt = facts.lengths, facts.n_prompt
    device = input_ids.device
    packs = []  # (first row of the group, rows of the group with a non-empty completion)
    for g in groups:
        packs.append((g[0], [i for i in g if lengths[i] > 0]))
    packs = [p for p in packs if p[1]]
    if not packs:  # no completion token (all masked): declined, so the result keeps the graph TRL's loss backs through
        return None
    logps = torch.zeros(rows, logits_to_keep, device=device)  # [B, C]
    entropies = torch.zeros(rows, logits_to_keep, device=device) if compute_entropy else None
    widths = [n_prompt[first] + sum(lengths[i] for i in members) for first, members in packs]
    state = trainer_state(trainer)
    got_logps, got_ent, at_rows, at_cols = [], [], [], []
    for forward in _forwards(packs, widths, budget):
        chosen = [packs[i] for i in forward]
        prefix_lens = [n_prompt[first] for first, _ in chosen]
        layout = PackedLayout.build(prefix_lens, [[lengths[i] for i in members] for _, members in chosen], device)
        ids = torch.zeros(len(chosen), layout.width, dtype=input_ids.dtype, device=device)  # [R, T]
        pos = torch.zeros(len(chosen), layout.width, dtype=torch.long, device=device)  # [R, T]
        pred_row, pred_pos, tgt_row, tgt_col = [], [], [], []
        for r, (first, members) in enumerate(chosen):
            p = prefix_lens[r]
            ids[r, :p] = input_ids[first, prompt_width - p : prompt_width]
            pos[r, :p] = torch.arange(prompt_width - p, prompt_width, device=device)  # TRL's row positions
            start = p
            for i in members:
                n = lengths[i]
                ids[r, start : start + n] = input_ids[i, prompt_width : prompt_width + n]
                pos[r, start : start + n] = torch.arange(prompt_width, prompt_width + n, device=device)
                pred_row += [r] * n
                pred_pos += [p - 1] + list(range(start, start + n - 1))  # position t predicts token t + 1
                tgt_row += [i] * n
                tgt_col += list(range(n))
                start += n
        mask = torch.ones(len(chosen), 1, 1, layout.width, dtype=torch.bool, device=device)  # [R, 1, 1, T]
        mask.slimrl_layout = layout  # read by slimrl_sdpa_or_shared_prefix in every layer
        with capture_head_input(head_module) as captured, trainer.accelerator.autocast():
            model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=0, use_cache=False)
        hidden = captured[-1]  # [R, T, H]
        index = (to_device(pred_row, device), to_device(pred_pos, device))
        targets = input_ids[to_device(tgt_row, device), prompt_width + to_device(tgt_col, device)]
        wanted = ("log_probs", "entropy") if compute_entropy else ("log_probs",)
        out = projection.outputs(hidden[index], targets, trainer.temperature, wanted)  # ([N], [N] | None, ...)
        got_logps.append(out[0])
        if compute_entropy:
            got_ent.append(out[1])
        at_rows += tgt_row
        at_cols += tgt_col
        state.served_calls += 1
        state.shared_prefix_forwards += 1
        if torch.is_grad_enabled():
            state.trained_tokens += len(tgt_row)
    where = (to_device(at_rows, device), to_device(at_cols, device))
    logps = logps.index_put(where, torch.cat(got_logps).to(logps.dtype))  # [B, C]
    if compute_entropy:
        entropies = entropies.index_put(where, torch.cat(got_ent).to(entropies.dtype))  # [B, C]
    return logps, entropies, None


def shared_prompts(trainer: Any, config: Any, rows: CallRows) -> list[list[int]] | None:
    """The call's rows grouped by prompt when it takes the layout, else None (with the reason logged once, see the
    module docstring)."""
    prompt_width = rows.input_ids.size(1) - rows.logits_to_keep
    if not fields_of(trainer.args).slimrl_shared_prefix:
        return None  # turned off: no line, and nothing read from the device
    reason = why_not(trainer, config, prompt_width, max(rows.facts.lengths, default=0))
    if reason is not None:
        say_once(reason)
        return None
    groups = groups_of(rows.facts)
    if groups is None:
        say_once("rows that are not one left-padded prompt then one completion")
        return None
    if all(len(g) == 1 for g in groups):
        return None  # no prompt repeats: nothing to share
    if on_gpu(rows) and not pays(trainer, config, rows, groups, prompt_width):
        say_once(
            f"on this GPU the layout costs more than it saves here (prompts of {prompt_width} tokens, groups of "
            f"{max(len(g) for g in groups)} completions of up to {max(rows.facts.lengths, default=0)}: "
            f"slimrl.planning.cuda_pass.shared_prefix_pays)"
        )
        return None
    return groups


def on_gpu(rows: CallRows) -> bool:
    return rows.input_ids.device.type == "cuda"


def pays(trainer: Any, config: Any, rows: CallRows, groups: list[list[int]], prompt: int) -> bool:
    """Whether the layout makes this call's pass faster on the GPU, by the training pass's time model: the prompt
    tokens its groups stop repeating against the layout's own traffic and launches."""
    from slimrl.compat.gpus import current_gpu, find_gpu
    from slimrl.compat.model_state import lora_rank
    from slimrl.models.fused_lora import is_fused
    from slimrl.planning.cuda_pass import shared_prefix_pays, slimrl_kernels
    from slimrl.planning.timing import DEFAULT_GPU

    model = trainer.model
    lora_r = lora_rank(model)
    checkpointed = torch.is_grad_enabled() and bool(getattr(trainer.args, "gradient_checkpointing", False))
    return shared_prefix_pays(
        config,
        current_gpu() or find_gpu(DEFAULT_GPU),
        slimrl_kernels(bool(lora_r) and is_fused(model)),
        rows=rows.input_ids.size(0),
        generations=max(len(g) for g in groups),
        prompt=prompt,
        completion=max(rows.facts.lengths, default=0),
        lora_r=lora_r,
        recompute=1.0 if checkpointed else 0.0,
    )
