"""The shared-prefix attention op (:mod:`slimrl.ops.prefix_attention`) against an fp64 reference with an explicit
mask, and against TRL's layout itself: each (prompt, completion) as its own causal row.

Tolerance: fp32 op vs fp64 reference, 1e-5 absolute on outputs and gradients (values O(1); fp32 accumulation over
at most 20 keys); the op in fp64 vs unpacked rows in fp64, 1e-10."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from slimrl.ops.prefix_attention import PackedLayout, reference_attention, shared_prefix_attention

# (prompt lengths, completion lengths per packed row): one group of 3, a singleton, a shorter prompt of 2
CASES = [([5], [[3, 1, 4]]), ([6, 3, 4], [[2, 5], [1], [3, 3, 1]])]


def _inputs(prefix_lens, segments, heads=4, kv=2, dim=8, dtype=torch.float64, seed=0):
    layout = PackedLayout.build(prefix_lens, segments, torch.device("cpu"))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(len(prefix_lens), heads, layout.width, dim, generator=g, dtype=dtype)  # [R, h, T, d]
    k = torch.randn(len(prefix_lens), kv, layout.width, dim, generator=g, dtype=dtype)  # [R, kv, T, d]
    v = torch.randn(len(prefix_lens), kv, layout.width, dim, generator=g, dtype=dtype)
    return layout, q, k, v


@pytest.mark.parametrize("prefix_lens,segments", CASES)
def test_matches_the_fp64_masked_reference_with_gradients(prefix_lens, segments):
    layout, q, k, v = _inputs(prefix_lens, segments)
    weight = torch.randn(q.size(0), layout.width, q.size(1), q.size(3), dtype=torch.float64)  # [R, T, h, d]
    grads = []
    for fn, dtype in ((reference_attention, torch.float64), (shared_prefix_attention, torch.float32)):
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out = fn(*leaves, layout, scaling=0.3)  # [R, T, h, d]
        (out.double() * weight).sum().backward()
        grads.append((out.double(), [t.grad.double() for t in leaves]))
    (ref, ref_grads), (got, got_grads) = grads
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    for a, b in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_each_completion_sees_what_its_own_unpacked_row_sees():
    prefix_lens, segments = CASES[1]
    layout, q, k, v = _inputs(prefix_lens, segments)
    packed = shared_prefix_attention(q, k, v, layout)  # [R, T, h, d]
    groups = q.size(1) // k.size(1)
    for s in range(layout.seg_len.numel()):
        r, a, n = int(layout.seg_row[s]), int(layout.seg_start[s]), int(layout.seg_len[s])
        p = prefix_lens[r]
        cols = list(range(p)) + list(range(a, a + n))  # TRL's row: [prompt, this completion]
        row = [t[r:r + 1, :, cols] for t in (q, k, v)]
        alone = sdpa(row[0], row[1].repeat_interleave(groups, 1),
                                               row[2].repeat_interleave(groups, 1), is_causal=True)  # [1, h, p+n, d]
        alone = alone.transpose(1, 2)[0]  # [p + n, h, d]
        torch.testing.assert_close(packed[r, a:a + n], alone[p:], atol=1e-10, rtol=0)
        torch.testing.assert_close(packed[r, :p], alone[:p], atol=1e-10, rtol=0)


def test_layout_rejects_nothing_it_cannot_index():
    layout = PackedLayout.build([2], [[1, 1]], torch.device("cpu"))
    assert layout.width == 4 and layout.seg_index.tolist() == [[2], [3]]
    assert layout.seg_mask.shape == (2, 1, 1, 3)
    assert layout.seg_mask[:, 0, 0].tolist() == [[True, True, True], [True, True, True]]


def efficient_kernel_problems(query: torch.Tensor, key: torch.Tensor, bias: torch.Tensor) -> list[str]:
    """What keeps the segments' attention (``query [S, h, L, d]``, ``key [S, h, P + L, d]``, ``bias``) out of SDPA's
    memory-efficient CUDA kernel (PyTorch's dispatch rules for it); empty when nothing does."""
    problems = []
    if bias.dtype != query.dtype:
        problems.append(f"bias dtype {bias.dtype} is not the query's {query.dtype} (SDPA would convert it each call)")
    if bias.dim() != 4 or bias.shape[1] != 1 or bias.shape[-2:] != (query.shape[-2], key.shape[-2]):
        problems.append(f"bias shape {tuple(bias.shape)} is not [S, 1, L, P + L]")
    if bias.stride(-1) != 1 or bias.stride(-2) % 16:
        problems.append(f"bias rows are not 16-aligned (strides {bias.stride()}): SDPA would pad a copy each call")
    if query.size(1) != key.size(1):
        problems.append("grouped-query heads not repeated (the kernel takes equal head counts)")
    if query.size(-1) % (4 if query.dtype == torch.float32 else 8):
        problems.append(f"head dim {query.size(-1)} is not a multiple of {4 if query.dtype == torch.float32 else 8}")
    if query.stride(-1) != 1 or key.stride(-1) != 1:
        problems.append("query or key with a strided last dimension")
    return problems


SHAPES = {"qwen2.5-1.5b": (12, 2, 128), "llama-3.1-8b": (32, 8, 128), "gemma-3-1b": (4, 1, 256), "smollm2": (9, 3, 64)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("model", list(SHAPES))
def test_segments_attention_meets_the_efficient_kernel(monkeypatch, model, dtype):
    """At real head sizes the segments' attention reaches SDPA as its memory-efficient CUDA kernel takes it (no
    per-call conversion or padding copy, no reason to fall back to the math kernel); the bias is built once per
    layout and dtype and is exactly the boolean mask."""
    from slimrl.ops import prefix_attention as pa

    heads, kv, dim = SHAPES[model]
    layout = pa.PackedLayout.build([40, 33], [[37, 50, 12], [64]], torch.device("cpu"))
    calls = []

    def spy(q, k, v, attn_mask=None, **kwargs):
        if attn_mask is not None:
            calls.append(efficient_kernel_problems(q, k, attn_mask))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(pa, "sdpa", spy)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads, layout.width, dim, generator=g).to(dtype)
    k, v = (torch.randn(2, kv, layout.width, dim, generator=g).to(dtype) for _ in range(2))
    pa.shared_prefix_attention(q, k, v, layout)
    pa.shared_prefix_attention(q, k, v, layout)
    assert calls == [[], []]
    bias = layout.bias(dtype)
    assert layout.bias(dtype) is bias  # once per layout and dtype
    assert torch.equal(bias == 0, layout.seg_mask) and torch.isinf(bias[~layout.seg_mask]).all()
