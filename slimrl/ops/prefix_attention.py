"""Attention over shared-prefix packed rows: each prompt computed once per group (GRPO, RLOO).

TRL's layout repeats a prompt in each of the ``G`` rows that hold its completions: ``G * (P + C)`` tokens. A packed
row holds the prompt once, then the completions sampled from it, then padding:

    [ p_0 .. p_{P-1} | c1_0 .. c1_{L1-1} | c2_0 .. c2_{L2-1} | ... | pad ]

Who attends to what (so that every real token sees exactly the keys it sees in TRL's row ``[prompt, c_i]``):

* a prompt query at ``t < P`` attends causally over the prompt (``j <= t``);
* a query of completion ``i`` at offset ``u`` attends to the whole prompt and to completion ``i``'s own offsets
  ``<= u``, never to another completion;
* padding queries take a finite value that no real query ever reads (they are no real query's keys).

With the position ids of TRL's row (the completion restarts where the prompt ends), every completion token gets
TRL's hidden states; the gradient that reaches the prompt is the sum of what its ``G`` copies receive, i.e. the same
parameter gradient. Work: ``P + sum L_i`` tokens per group through every linear layer instead of ``G * P + sum L_i``.

No mask is built: the prompt queries run as one causal attention over the first ``P`` positions; the completions as
batched attention of ``S`` segments x ``L`` queries over ``p + L`` keys (the prompt's ``p`` real keys gathered once
per segment, then the segment's own keys), which is causal aligned to the bottom right: query ``u`` sees every prompt
key and its own keys ``<= u``. PyTorch states that pattern without a tensor (``causal_lower_right`` of
``torch.nn.attention.bias``) and runs it in flash attention where the GPU has it (capability >= 8.0, 16-bit), else in
the memory-efficient kernel with its built-in lower-right mask, on a CPU through an explicit boolean mask. Segments are
batched by their row's prompt length (one batch when every row's prompt is equally long, as in GRPO's usual batch of
one prompt's completions), so memory grows with ``P + G * C`` per group and the kernel skips the keys a query does not
see: the work of TRL's own causal rows, less the repeated prompts. Grouped-query keys and values reach flash as they
are (``enable_gqa``) where PyTorch's own check says flash takes them (:func:`shares_kv_heads`); elsewhere each K/V
head is repeated for its query heads, as the memory-efficient kernel needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention.bias import causal_lower_right
from torch.nn.functional import scaled_dot_product_attention as sdpa

from slimrl.compat.host_transfer import move, to_device

# Model families whose decoder takes explicit position ids and runs attention through transformers' interface,
# tested against TRL's layout (tests/patching/routes/test_shared_prefix.py).
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma3_text", "smollm3")


def model_reason(config: Any, row_tokens: int) -> str | None:
    """Why a model of ``config`` cannot run this attention on rows of ``row_tokens`` (prompt + completion) tokens:
    a family not tested with it, attention soft-capping, a sliding window shorter than the row; None: it can."""
    text = getattr(config, "text_config", None) or config
    if config.model_type not in FAMILIES and getattr(text, "model_type", None) not in FAMILIES:
        return f"model type {config.model_type!r} is not tested with the layout (tested: {', '.join(FAMILIES)})"
    if getattr(text, "attn_logit_softcapping", None):
        return "attention soft-capping"
    window = getattr(text, "sliding_window", None)
    uses_window = window and (getattr(text, "use_sliding_window", True) or getattr(text, "layer_types", None))
    if uses_window and row_tokens > window:
        return f"a sliding window of {window} tokens, shorter than prompt + completion ({row_tokens})"
    return None


@dataclass(frozen=True)
class PackedLayout:
    """Where each segment of the packed rows ``[R, T]`` lies, and the index tensors the attention uses.

    ``prefix_len [R]``: real prompt tokens of each packed row (they come first). ``seg_row / seg_start / seg_len
    [S]``: the packed row, first position and length of each completion segment (``seg_len >= 1``).
    """

    prefix_len: torch.Tensor  # [R] long
    seg_row: torch.Tensor  # [S] long
    seg_start: torch.Tensor  # [S] long
    seg_len: torch.Tensor  # [S] long
    width: int  # T: packed row width
    prefix_width: int  # P: the longest prompt
    seg_width: int  # L: the longest segment
    seg_index: torch.Tensor  # [S, L] long: positions of each segment's tokens (clamped past its end)
    source: torch.Tensor  # [R, T] long: index of each position's output in cat(prompt outputs, segment outputs)
    # one batch per distinct prompt length p: (p, its segments [s] or None when every segment's row has p)
    by_prefix: tuple[tuple[int, torch.Tensor | None], ...]
    seg_unsort: torch.Tensor | None  # [S] long: the batches' outputs back in segment order (None: one batch)

    @classmethod
    def build(cls, prefix_lens: list[int], segments: list[list[int]], device: torch.device) -> PackedLayout:
        """The layout of packed rows ``r`` = ``prefix_lens[r]`` prompt tokens then segments of ``segments[r]``
        tokens each (every length >= 1), right-padded to the widest row."""
        rows = len(prefix_lens)
        widths = [p + sum(segs) for p, segs in zip(prefix_lens, segments)]
        width, pw = max(widths), max(prefix_lens)
        seg_row, seg_start, seg_len = [], [], []
        for r, (p, segs) in enumerate(zip(prefix_lens, segments)):
            start = p
            for n in segs:
                seg_row.append(r)
                seg_start.append(start)
                seg_len.append(n)
                start += n
        lw = max(seg_len)
        n_seg = len(seg_len)
        long = dict(dtype=torch.long)
        prefix = torch.tensor(prefix_lens, **long)  # [R]
        row_t, start_t, len_t = (torch.tensor(x, **long) for x in (seg_row, seg_start, seg_len))  # [S]
        offs = torch.arange(lw)  # [L]
        seg_index = torch.minimum(start_t[:, None] + offs, (start_t + len_t - 1)[:, None])  # [S, L]
        seg_prefix = [prefix_lens[r] for r in seg_row]
        distinct = sorted(set(seg_prefix))
        members = [[s for s in range(n_seg) if seg_prefix[s] == p] for p in distinct]
        # outputs: prompt positions read the prompt pass ([R * P] first), segment positions the segment pass
        # ([S * L] after), padding reads its row's first prompt output (finite, never read by a real query)
        source = (torch.arange(rows)[:, None] * pw).expand(rows, width).clone()  # [R, T]
        for r in range(rows):
            source[r, : prefix_lens[r]] = r * pw + torch.arange(prefix_lens[r])
        for s in range(n_seg):
            a = seg_start[s]
            source[seg_row[s], a : a + seg_len[s]] = rows * pw + s * lw + torch.arange(seg_len[s])
        one = len(distinct) == 1
        by_prefix = tuple((p, None if one else to_device(m, device)) for p, m in zip(distinct, members))
        order = [s for m in members for s in m]  # the batches' segments, concatenated
        unsort = (
            None
            if one
            else move(torch.empty(n_seg, **long).scatter_(0, torch.tensor(order, **long), torch.arange(n_seg)), device)
        )
        return cls(
            move(prefix, device),
            move(row_t, device),
            move(start_t, device),
            move(len_t, device),
            width,
            pw,
            lw,
            move(seg_index, device),
            move(source, device),
            by_prefix,
            unsort,
        )


def _repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, kv, T, d] -> [B, kv * groups, T, d]`` (grouped-query attention's key/value heads shared)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def shares_kv_heads(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether SDPA's flash kernel takes grouped-query keys and values as they are (``enable_gqa``, no copy of each
    K/V head per query head): PyTorch's own check, on CUDA; elsewhere, or where flash does not serve the device, dtype
    or head size (then the memory-efficient kernel runs, which needs them repeated), False."""
    if query.size(1) == key.size(1) or query.device.type != "cuda":
        return False
    from torch.backends.cuda import SDPAParams, can_use_flash_attention

    return bool(can_use_flash_attention(SDPAParams(query, key, key, None, 0.0, False, True), False))


def _pick(x: torch.Tensor, sel: torch.Tensor | None) -> torch.Tensor:
    """The segments ``sel`` of ``x [S, ...]`` (all of them for None)."""
    return x if sel is None else x.index_select(0, sel)


def shared_prefix_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: PackedLayout,
    scaling: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """``query [R, h, T, d]``, ``key/value [R, kv, T, d]`` of packed rows -> attention output ``[R, T, h, d]`` (the
    layout transformers' attention functions return), computed as the module docstring says."""
    rows, heads, _, dim = query.shape
    groups = heads // key.size(1)
    pw, lw, n_seg = layout.prefix_width, layout.seg_width, layout.seg_len.numel()
    gqa = shares_kv_heads(query[:, :, :pw], key[:, :, :pw])
    heads_of = (lambda x: x) if gqa else (lambda x: _repeat_heads(x, groups))  # [., kv | h, ., d]
    # prompt queries: causal over the first P positions of each row
    prompt = sdpa(
        query[:, :, :pw],
        heads_of(key[:, :, :pw]),
        heads_of(value[:, :, :pw]),
        dropout_p=dropout,
        is_causal=True,
        scale=scaling,
        enable_gqa=gqa,
    )  # [R, h, P, d]
    # completion queries: the segment's own tokens, gathered, over [prompt keys of its row | its own keys]
    rows_idx = layout.seg_row[:, None]  # [S, 1]

    def segment(x: torch.Tensor) -> torch.Tensor:  # [R, n, T, d] -> [S, n, L, d]
        return x.transpose(1, 2)[rows_idx, layout.seg_index].transpose(1, 2)

    q_seg, k_own, v_own = segment(query), segment(key), segment(value)  # [S, h | kv, L, d]
    # PyTorch's causal bias checks its inputs' dtypes before autocast would cast them, as SDPA's autocast does
    kind = query.device.type
    cast = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    outs = []
    for p, sel in layout.by_prefix:
        rows_of = _pick(layout.seg_row, sel)  # [s]
        keys = torch.cat([key[:, :, :p].index_select(0, rows_of), _pick(k_own, sel)], dim=2)  # [s, kv, p + L, d]
        vals = torch.cat([value[:, :, :p].index_select(0, rows_of), _pick(v_own, sel)], dim=2)  # [s, kv, p + L, d]
        q, k, v = _pick(q_seg, sel), heads_of(keys), heads_of(vals)
        if cast is not None:
            q, k, v = q.to(cast), k.to(cast), v.to(cast)
        mask = causal_lower_right(lw, p + lw)
        outs.append(sdpa(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=gqa))  # [s, h, L, d]
    own = outs[0] if layout.seg_unsort is None else torch.cat(outs).index_select(0, layout.seg_unsort)  # [S, h, L, d]
    flat = torch.cat(
        [prompt.transpose(1, 2).reshape(rows * pw, heads, dim), own.transpose(1, 2).reshape(n_seg * lw, heads, dim)]
    )  # [R*P + S*L, h, d]
    return flat[layout.source]  # [R, T, h, d]


def reference_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout, scaling: float | None = None
) -> torch.Tensor:
    """The same attention with an explicit ``[R, T, T]`` mask and plain softmax (for tests, in any dtype); padding
    queries attend to nothing real and return their row's first prompt output, as the op does."""
    rows, heads, width, dim = query.shape
    groups = heads // key.size(1)
    k, v = _repeat_heads(key, groups), _repeat_heads(value, groups)
    seg_of = torch.full((rows, width), -1, dtype=torch.long, device=query.device)  # [R, T]: segment id, -1 prompt
    for s in range(layout.seg_len.numel()):
        r, a, n = int(layout.seg_row[s]), int(layout.seg_start[s]), int(layout.seg_len[s])
        seg_of[r, a : a + n] = s
    pos = torch.arange(width, device=query.device)
    prompt = pos[None, :] < layout.prefix_len[:, None]  # [R, T]
    real = prompt | (seg_of >= 0)  # [R, T]
    causal = pos[:, None] >= pos[None, :]  # [T, T]
    same = seg_of[:, :, None] == seg_of[:, None, :]  # [R, T, T]
    allowed = causal & (prompt[:, None, :] | (same & (seg_of[:, :, None] >= 0)))  # [R, T(q), T(k)]
    allowed &= real[:, :, None] & real[:, None, :]
    scores = query @ k.transpose(-1, -2) * (scaling if scaling is not None else dim**-0.5)  # [R, h, T, T]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.nan_to_num(scores.softmax(-1)) @ v  # [R, h, T, d]
    out = out.transpose(1, 2)  # [R, T, h, d]
    first = out[:, :1].expand_as(out)
    return torch.where(real[:, :, None, None], out, first)
