"""The shared-prefix attention op on each device this machine has (CUDA on a GPU machine, the CPU everywhere)
against PyTorch's SDPA on TRL's own unpacked rows ([prompt, completion], causal), values and gradients.

The GPU runner's command A runs this file on CUDA; here it runs on the CPU, so the comparison itself is checked
wherever ``make test`` runs. Tolerance (absolute; values and gradients are O(1)): fp32 1e-4 (SDPA's CUDA kernels
accumulate in their own order, TF32 stays off for them), bf16 3e-2 (8 mantissa bits on inputs and output; both
sides accumulate in fp32)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from slimrl.ops.prefix_attention import PackedLayout, shared_prefix_attention

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}
PREFIX_LENS, SEGMENTS = [6, 3, 4], [[2, 5], [1], [3, 3, 1]]  # a group of 2, a singleton, a group of 3


def _leaves(device: str, dtype: torch.dtype, heads: int = 4, kv: int = 2, dim: int = 16):
    layout = PackedLayout.build(PREFIX_LENS, SEGMENTS, torch.device(device))
    g = torch.Generator().manual_seed(0)
    shape = [(len(PREFIX_LENS), n, layout.width, dim) for n in (heads, kv, kv)]  # q [R, h, T, d], k/v [R, kv, T, d]
    return layout, [torch.randn(*s, generator=g).to(device, dtype).requires_grad_() for s in shape]


def _unpacked(q, k, v, layout) -> list[tuple[int, int, torch.Tensor]]:
    """Each completion attended the way TRL lays it out: its own row [prompt, completion], SDPA causal."""
    groups = q.size(1) // k.size(1)
    rows = []
    for s in range(layout.seg_len.numel()):
        r, a, n = int(layout.seg_row[s]), int(layout.seg_start[s]), int(layout.seg_len[s])
        cols = torch.tensor(list(range(PREFIX_LENS[r])) + list(range(a, a + n)), device=q.device)
        qs, ks, vs = (t[r : r + 1, :, cols] for t in (q, k, v))
        out = sdpa(qs, ks.repeat_interleave(groups, 1), vs.repeat_interleave(groups, 1), is_causal=True)
        rows.append((r, a, out.transpose(1, 2)[0, PREFIX_LENS[r] :]))  # [n, h, d]: the completion's positions
    return rows


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_completions_match_sdpa_on_unpacked_rows(device, dtype):
    layout, (q, k, v) = _leaves(device, dtype)
    packed = shared_prefix_attention(q, k, v, layout)  # [R, T, h, d]
    weight = torch.randn(packed.shape, generator=torch.Generator().manual_seed(1)).to(device)
    tol = TOLERANCE[dtype]
    rows = _unpacked(q, k, v, layout)
    for r, a, alone in rows:
        torch.testing.assert_close(packed[r, a : a + alone.size(0)].float(), alone.float(), atol=tol, rtol=0)
    # the same loss on both layouts: the completions' outputs weighted alike; gradients w.r.t. q, k, v
    loss_packed = sum((packed[r, a : a + o.size(0)].float() * weight[r, a : a + o.size(0)]).sum() for r, a, o in rows)
    grads_packed = torch.autograd.grad(loss_packed, (q, k, v))
    loss_rows = sum((o.float() * weight[r, a : a + o.size(0)]).sum() for r, a, o in _unpacked(q, k, v, layout))
    grads_rows = torch.autograd.grad(loss_rows, (q, k, v))
    for got, ref in zip(grads_packed, grads_rows):
        assert got.abs().max() > 0
        torch.testing.assert_close(got.float(), ref.float(), atol=tol * max(1.0, float(ref.abs().max())), rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("heads, kv, dim", [(12, 2, 128), (32, 8, 128), (4, 1, 256)])
def test_segments_take_a_fused_kernel_and_memory_linear_in_the_completions(monkeypatch, heads, kv, dim):
    """PyTorch's own dispatch check says the segments' attention (lower-right causal, no mask tensor) runs in flash
    attention on this GPU (capability >= 8.0) or else the memory-efficient kernel; one layer at 8 completions over a
    256-token prompt grows its memory linearly with the completions' length (1,024 -> 2,048 tokens: at most 2.5x;
    a kernel that held scores or a mask, ``L x (P + L)`` per segment, would grow about 3.6x)."""
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    from slimrl.ops import prefix_attention as pa

    seen = []

    def spy(q, k, v, attn_mask=None, **kwargs):
        if attn_mask is not None:
            params = SDPAParams(q, k, v, None, 0.0, False, False)
            seen.append(can_use_flash_attention(params) or can_use_efficient_attention(params))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(pa, "sdpa", spy)
    grown = []
    for length in (1024, 2048):
        layout = PackedLayout.build([256], [[length] * 8], torch.device("cuda"))
        q = torch.randn(1, heads, layout.width, dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, kv, layout.width, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()  # a test process: its own counters
        before = torch.cuda.memory_allocated()
        pa.shared_prefix_attention(q, k, v, layout)
        torch.cuda.synchronize()
        grown.append(torch.cuda.max_memory_allocated() - before)
    assert seen == [True, True] and grown[1] < 2.5 * grown[0], (seen, grown)
