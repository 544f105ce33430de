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
