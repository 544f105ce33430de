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
        row = [t[r : r + 1, :, cols] for t in (q, k, v)]
        alone = sdpa(
            row[0], row[1].repeat_interleave(groups, 1), row[2].repeat_interleave(groups, 1), is_causal=True
        )  # [1, h, p+n, d]
        alone = alone.transpose(1, 2)[0]  # [p + n, h, d]
        torch.testing.assert_close(packed[r, a : a + n], alone[p:], atol=1e-10, rtol=0)
        torch.testing.assert_close(packed[r, :p], alone[:p], atol=1e-10, rtol=0)


def test_layout_rejects_nothing_it_cannot_index():
    layout = PackedLayout.build([2], [[1, 1]], torch.device("cpu"))
    assert layout.width == 4 and layout.seg_index.tolist() == [[2], [3]]
    assert [(p, sel) for p, sel in layout.by_prefix] == [(2, None)] and layout.seg_unsort is None


def test_segments_are_batched_by_their_prompt_length():
    """Rows with prompts of 6, 3 and 6 tokens: two batches (3: the second row's segment; 6: the others), put back in
    segment order."""
    layout = PackedLayout.build([6, 3, 6], [[2, 5], [1], [3, 3, 1]], torch.device("cpu"))
    assert [(p, sel.tolist()) for p, sel in layout.by_prefix] == [(3, [2]), (6, [0, 1, 3, 4, 5])]
    assert torch.cat([sel for _, sel in layout.by_prefix])[layout.seg_unsort].tolist() == list(range(6))


def causal_kernel_problems(query: torch.Tensor, key: torch.Tensor, mask) -> list[str]:
    """What keeps the segments' attention (``query [s, h, L, d]``, ``key [s, h, p + L, d]``) out of SDPA's fused CUDA
    kernels (flash, memory-efficient): a mask other than PyTorch's lower-right causal bias of those lengths (the one
    the kernels apply without a tensor), unequal head counts, a head dim or a last-dimension stride they do not take;
    empty when nothing does."""
    from torch.nn.attention.bias import CausalBias, CausalVariant

    problems = []
    if not isinstance(mask, CausalBias) or mask.variant != CausalVariant.LOWER_RIGHT:
        problems.append(f"mask {type(mask).__name__} is not causal_lower_right (a tensor mask rules out flash)")
    elif (mask.seq_len_q, mask.seq_len_kv) != (query.shape[-2], key.shape[-2]):
        problems.append(f"mask lengths {(mask.seq_len_q, mask.seq_len_kv)} are not the query's and the keys'")
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
def test_segments_attention_meets_the_causal_kernels(monkeypatch, model, dtype):
    """At real head sizes the segments' attention reaches SDPA as its fused CUDA kernels take it: PyTorch's
    lower-right causal bias (no mask tensor, keys a query does not see skipped), one call per distinct prompt length
    after the prompt's own causal call."""
    from slimrl.ops import prefix_attention as pa

    heads, kv, dim = SHAPES[model]
    calls = []

    def spy(q, k, v, attn_mask=None, is_causal=False, **kwargs):
        calls.append("causal" if is_causal and attn_mask is None else causal_kernel_problems(q, k, attn_mask))
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs
        )

    monkeypatch.setattr(pa, "sdpa", spy)
    g = torch.Generator().manual_seed(0)
    for prefix_lens, batches in (([40, 40], 1), ([40, 33], 2)):
        layout = pa.PackedLayout.build(prefix_lens, [[37, 50, 12], [64]], torch.device("cpu"))
        q = torch.randn(2, heads, layout.width, dim, generator=g).to(dtype)
        k, v = (torch.randn(2, kv, layout.width, dim, generator=g).to(dtype) for _ in range(2))
        calls.clear()
        pa.shared_prefix_attention(q, k, v, layout)
        assert calls == ["causal"] + [[]] * batches


def test_under_autocast_mixed_input_dtypes_are_cast_as_sdpa_casts_them():
    """Under autocast SDPA casts its inputs to the autocast dtype; PyTorch's causal bias checks the dtypes first, so
    the op casts them itself (seen in a CPU bf16-autocast GRPO run: fp32 queries and keys, bf16 values). Same values
    as the unpacked rows' SDPA under the same autocast (bf16: 3e-2)."""
    prefix_lens, segments = CASES[1]
    layout, q, k, v = _inputs(prefix_lens, segments, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        packed = shared_prefix_attention(q, k, v.to(torch.bfloat16), layout)  # [R, T, h, d]
        groups = q.size(1) // k.size(1)
        for s in range(layout.seg_len.numel()):
            r, a, n = int(layout.seg_row[s]), int(layout.seg_start[s]), int(layout.seg_len[s])
            cols = list(range(prefix_lens[r])) + list(range(a, a + n))
            row = [t[r : r + 1, :, cols] for t in (q, k, v.to(torch.bfloat16))]
            alone = sdpa(
                row[0], row[1].repeat_interleave(groups, 1), row[2].repeat_interleave(groups, 1), is_causal=True
            ).transpose(1, 2)[0]  # [p + n, h, d]
            torch.testing.assert_close(packed[r, a : a + n].float(), alone[prefix_lens[r] :].float(), atol=3e-2, rtol=0)


@pytest.mark.parametrize("prefix_lens,segments", CASES)
def test_grouped_query_keys_unrepeated_match_the_reference(monkeypatch, prefix_lens, segments):
    """Where flash takes grouped-query K/V as they are (``enable_gqa``, forced here: a CPU's SDPA takes it too), the
    op passes the ``kv`` heads unrepeated and still matches the fp64 reference, gradients included."""
    from slimrl.ops import prefix_attention as pa

    layout, q, k, v = _inputs(prefix_lens, segments)
    seen = []
    real_sdpa = pa.sdpa

    def spy(q_, k_, v_, **kwargs):
        seen.append((q_.size(1), k_.size(1), kwargs.get("enable_gqa")))
        return real_sdpa(q_, k_, v_, **kwargs)

    monkeypatch.setattr(pa, "shares_kv_heads", lambda query, key: True)
    monkeypatch.setattr(pa, "sdpa", spy)
    leaves = [t.detach().float().requires_grad_() for t in (q, k, v)]
    got = pa.shared_prefix_attention(*leaves, layout, scaling=0.3)  # [R, T, h, d]
    assert seen and all(s == (4, 2, True) for s in seen), seen
    ref_leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    ref = reference_attention(*ref_leaves, layout, scaling=0.3)
    weight = torch.randn_like(ref)
    (got.double() * weight).sum().backward()
    (ref * weight).sum().backward()
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)
    for a, b in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=0)


def test_kv_heads_are_shared_only_where_torchs_flash_check_says_so(monkeypatch):
    """On a CPU, or with as many K/V heads as query heads, nothing is asked; on CUDA, PyTorch's own
    ``can_use_flash_attention`` with ``enable_gqa`` decides (a T4 has no flash: its K/V are repeated)."""
    from types import SimpleNamespace

    import torch.backends.cuda as tcuda

    from slimrl.ops.prefix_attention import shares_kv_heads

    asked = []
    monkeypatch.setattr(tcuda, "SDPAParams", lambda *a: asked.append(a[-1]) or a)
    answer = {"flash": True}
    monkeypatch.setattr(tcuda, "can_use_flash_attention", lambda params, debug: answer["flash"])
    cpu_q, cpu_k = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 2, 8)
    assert not shares_kv_heads(cpu_q, cpu_k) and asked == []

    def on_cuda(heads):
        return SimpleNamespace(size=lambda i: heads, device=torch.device("cuda"))

    assert not shares_kv_heads(on_cuda(4), on_cuda(4)) and asked == []
    assert shares_kv_heads(on_cuda(4), on_cuda(2)) and asked == [True]
    answer["flash"] = False
    assert not shares_kv_heads(on_cuda(4), on_cuda(2))
