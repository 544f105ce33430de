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

No ``[T, T]`` mask is built: the prompt queries run as one causal attention over the first ``P`` positions, the
completions as one batched attention of ``S`` segments x ``L`` queries over ``P + L`` keys (the prompt's keys gathered
once per segment, each segment's own keys causal), so memory grows with ``P + G * C`` per group.

**On CUDA** that batched attention must run in SDPA's memory-efficient kernel (flash attention takes no mask): in
the math kernel one layer's scores ``[S, h, L, P + L]`` in fp32 would be ~7 GB at 8 x 4,096 tokens. The kernel takes
an additive bias in the query's dtype whose rows start on 16-element boundaries, broadcast over heads, and inputs of
equal head counts with a contiguous last dimension; a boolean mask is converted (and padded to that alignment) by SDPA
at every call, forward and backward, in every layer. :meth:`PackedLayout.bias` builds that bias once per layout and
dtype (``[S, 1, L, P + L]``, ``-inf`` where a key is not seen, rows padded to a multiple of 16: ``S * L *
ceil16(P + L)`` elements, which ``slimrl plan`` counts), and the keys' heads are repeated for grouped-query models
(tested at real head sizes: tests/ops/test_prefix_attention.py states the constraints, tests/gpu asks PyTorch's own
dispatch check on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

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
    seg_mask: torch.Tensor  # [S, 1, L, P + L] bool: prompt keys of the segment's row + its own causal keys
    source: torch.Tensor  # [R, T] long: index of each position's output in cat(prompt outputs, segment outputs)
    _biases: dict = field(default_factory=dict, compare=False, repr=False)

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """``seg_mask`` as SDPA's memory-efficient kernel takes it (the module docstring): ``[S, 1, L, P + L]`` in
        ``dtype``, 0 where a key is seen and ``-inf`` elsewhere, each row starting on a 16-element boundary."""
        if dtype not in self._biases:
            s, _, lw, keys = self.seg_mask.shape
            padded = torch.full((s, 1, lw, -(-keys // 16) * 16), float("-inf"), dtype=dtype,
                                device=self.seg_mask.device)  # [S, 1, L, ceil16(P + L)]
            padded[..., :keys].masked_fill_(self.seg_mask, 0.0)
            self._biases[dtype] = padded[..., :keys]
        return self._biases[dtype]

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
        keys = torch.arange(pw)  # [P]
        prompt_ok = keys[None, None, :] < prefix[row_t][:, None, None]  # [S, 1, P]
        own_ok = offs[None, :, None] >= offs[None, None, :]  # [1, L, L]: causal within the segment
        seg_mask = torch.cat([prompt_ok.expand(n_seg, lw, pw), own_ok.expand(n_seg, lw, lw)], dim=-1)  # [S, L, P+L]
        # outputs: prompt positions read the prompt pass ([R * P] first), segment positions the segment pass
        # ([S * L] after), padding reads its row's first prompt output (finite, never read by a real query)
        source = (torch.arange(rows)[:, None] * pw).expand(rows, width).clone()  # [R, T]
        for r in range(rows):
            source[r, :prefix_lens[r]] = r * pw + torch.arange(prefix_lens[r])
        for s in range(n_seg):
            a = seg_start[s]
            source[seg_row[s], a:a + seg_len[s]] = rows * pw + s * lw + torch.arange(seg_len[s])
        move = {"device": device}
        return cls(prefix.to(**move), row_t.to(**move), start_t.to(**move), len_t.to(**move), width, pw, lw,
                   seg_index.to(**move), seg_mask[:, None].to(**move), source.to(**move))


def _repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, kv, T, d] -> [B, kv * groups, T, d]`` (grouped-query attention's key/value heads shared)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def shared_prefix_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout,
                            scaling: float | None = None, dropout: float = 0.0) -> torch.Tensor:
    """``query [R, h, T, d]``, ``key/value [R, kv, T, d]`` of packed rows -> attention output ``[R, T, h, d]`` (the
    layout transformers' attention functions return), computed as the module docstring says."""
    rows, heads, _, dim = query.shape
    groups = heads // key.size(1)
    pw, lw, n_seg = layout.prefix_width, layout.seg_width, layout.seg_len.numel()
    # prompt queries: causal over the first P positions of each row
    prompt = sdpa(
        query[:, :, :pw], _repeat_heads(key[:, :, :pw], groups), _repeat_heads(value[:, :, :pw], groups),
        dropout_p=dropout, is_causal=True, scale=scaling)  # [R, h, P, d]
    # completion queries: the segment's own tokens, gathered, over [prompt keys of its row | its own keys]
    rows_idx = layout.seg_row[:, None]  # [S, 1]

    def segment(x: torch.Tensor) -> torch.Tensor:  # [R, n, T, d] -> [S, n, L, d]
        return x.transpose(1, 2)[rows_idx, layout.seg_index].transpose(1, 2)

    seg_keys = torch.cat([key[:, :, :pw].index_select(0, layout.seg_row), segment(key)], dim=2)  # [S, kv, P+L, d]
    seg_vals = torch.cat([value[:, :, :pw].index_select(0, layout.seg_row), segment(value)], dim=2)  # [S, kv, P+L, d]
    own = sdpa(
        segment(query), _repeat_heads(seg_keys, groups), _repeat_heads(seg_vals, groups),
        attn_mask=layout.bias(query.dtype), dropout_p=dropout, scale=scaling)  # [S, h, L, d]
    flat = torch.cat([prompt.transpose(1, 2).reshape(rows * pw, heads, dim),
                      own.transpose(1, 2).reshape(n_seg * lw, heads, dim)])  # [R*P + S*L, h, d]
    return flat[layout.source]  # [R, T, h, d]


def reference_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: PackedLayout,
                        scaling: float | None = None) -> torch.Tensor:
    """The same attention with an explicit ``[R, T, T]`` mask and plain softmax (for tests, in any dtype); padding
    queries attend to nothing real and return their row's first prompt output, as the op does."""
    rows, heads, width, dim = query.shape
    groups = heads // key.size(1)
    k, v = _repeat_heads(key, groups), _repeat_heads(value, groups)
    seg_of = torch.full((rows, width), -1, dtype=torch.long, device=query.device)  # [R, T]: segment id, -1 prompt
    for s in range(layout.seg_len.numel()):
        r, a, n = int(layout.seg_row[s]), int(layout.seg_start[s]), int(layout.seg_len[s])
        seg_of[r, a:a + n] = s
    pos = torch.arange(width, device=query.device)
    prompt = pos[None, :] < layout.prefix_len[:, None]  # [R, T]
    real = prompt | (seg_of >= 0)  # [R, T]
    causal = pos[:, None] >= pos[None, :]  # [T, T]
    same = seg_of[:, :, None] == seg_of[:, None, :]  # [R, T, T]
    allowed = causal & (prompt[:, None, :] | (same & (seg_of[:, :, None] >= 0)))  # [R, T(q), T(k)]
    allowed &= real[:, :, None] & real[:, None, :]
    scores = query @ k.transpose(-1, -2) * (scaling if scaling is not None else dim ** -0.5)  # [R, h, T, T]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.nan_to_num(scores.softmax(-1)) @ v  # [R, h, T, d]
    out = out.transpose(1, 2)  # [R, T, h, d]
    first = out[:, :1].expand_as(out)
    return torch.where(real[:, :, None, None], out, first)
