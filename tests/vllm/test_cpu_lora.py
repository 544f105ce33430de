"""slimrl's single-adapter LoRA ops against vLLM's own and a float64 reference.

Tolerance 1e-5 relative in float32: one GEMM vs vLLM's per-token einsum sum the same r (or in) products in
different orders; float32 rounding of a 576-term sum is ~1e-6 relative.
"""

from __future__ import annotations

import pytest
import torch

from slimrl.generation import vllm_status

pytestmark = pytest.mark.skipif(vllm_status() is not None, reason=f"vLLM not usable here: {vllm_status()}")


@pytest.fixture
def ops():
    from vllm.lora.ops.torch_ops import lora_ops

    from slimrl.generation import cpu_lora

    was_installed = bool(cpu_lora._SWAPS)
    cpu_lora.uninstall()
    originals = {n: getattr(lora_ops, n) for n in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")}
    cpu_lora.install()
    yield cpu_lora, originals
    if not was_installed:
        cpu_lora.uninstall()


@pytest.mark.parametrize(
    "indices",
    [[1, 1, 1, 1, 1], [0, 1, 1, 0, 1], [-1, -1, 1, 1, 1]],
    ids=["one-adapter", "two-adapters", "some-without"],
)
def test_ops_equal_vllms_and_float64(ops, indices):
    cpu_lora, vllm_ops = ops
    torch.manual_seed(0)
    idx = torch.tensor(indices)
    n, d, r, out = len(indices), 576, 16, 192
    x, h = torch.randn(n, d), torch.randn(n, r)
    a, b = torch.randn(3, 1, r, d), torch.randn(3, 1, out, r)  # [slots, 1, r, in], [slots, 1, out, r]

    ref = torch.zeros(n, r, dtype=torch.float64)
    for t, i in enumerate(indices):
        ref[t] = 0.5 * x[t].double() @ a[i, 0].double().T
    y_fast, y_vllm = torch.zeros(n, r), torch.zeros(n, r)
    cpu_lora.fast_bgmv_shrink(x, a, y_fast, idx, 0.5)
    vllm_ops["bgmv_shrink"](x, a, y_vllm, idx, 0.5)
    torch.testing.assert_close(y_fast, y_vllm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_fast.double(), ref, rtol=1e-5, atol=1e-5)

    base = torch.randn(n, out + 64)
    ref = base.double().clone()
    for t, i in enumerate(indices):
        ref[t, 32 : 32 + out] += h[t].double() @ b[i, 0].double().T
    z_fast, z_vllm = base.clone(), base.clone()
    cpu_lora.fast_bgmv_expand_slice(h, b, z_fast, idx, 32, out, True)
    vllm_ops["bgmv_expand_slice"](h, b, z_vllm, idx, 32, out, True)
    torch.testing.assert_close(z_fast, z_vllm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(z_fast.double(), ref, rtol=1e-5, atol=1e-5)

    w_fast, w_vllm = torch.zeros(n, out), torch.zeros(n, out)
    cpu_lora.fast_bgmv_expand(h, b, w_fast, idx, False)
    vllm_ops["bgmv_expand"](h, b, w_vllm, idx, False)
    torch.testing.assert_close(w_fast, w_vllm, rtol=1e-5, atol=1e-5)


def test_install_swaps_both_modules_and_uninstall_restores():
    from vllm.lora.ops.torch_ops import lora_ops
    from vllm.lora.punica_wrapper import punica_cpu

    from slimrl.generation import cpu_lora

    was_installed = bool(cpu_lora._SWAPS)  # an engine started earlier in this process installs it
    cpu_lora.uninstall()
    before = (lora_ops.bgmv_shrink, punica_cpu.bgmv_expand_slice)
    assert before[0] is not cpu_lora.fast_bgmv_shrink
    assert cpu_lora.install()
    assert lora_ops.bgmv_shrink is cpu_lora.fast_bgmv_shrink
    assert punica_cpu.bgmv_expand_slice is cpu_lora.fast_bgmv_expand_slice
    cpu_lora.uninstall()
    assert (lora_ops.bgmv_shrink, punica_cpu.bgmv_expand_slice) == before
    if was_installed:
        cpu_lora.install()


def test_packed_layer_two_gemms_equal_float64_and_follow_a_new_adapter(ops):
    """``fast_add_lora_linear`` on a q/k/v-like packed layer (3 slices of different widths) equals the float64
    formula; after vLLM writes a new adapter into the same slot (in place, as ``set_lora`` does) the next call uses
    it (the packed copies are rebuilt)."""
    import gc
    from types import SimpleNamespace

    cpu_lora, _ = ops
    torch.manual_seed(0)
    n, d_in, r, slices, slot = 6, 40, 4, (40, 12, 12), 1
    a_stacked = tuple(torch.randn(2, 1, r, d_in) for _ in slices)  # [max_loras, 1, r, in]
    b_stacked = tuple(torch.randn(2, 1, s, r) for s in slices)  # [max_loras, 1, out_s, r]
    x = torch.randn(n, d_in)
    wrapper = SimpleNamespace(token_lora_indices=torch.full((n,), slot))

    def reference(a_stacked, b_stacked):
        y = torch.zeros(n, sum(slices), dtype=torch.float64)
        offset = 0
        for a, b, s in zip(a_stacked, b_stacked, slices, strict=True):
            y[:, offset : offset + s] += 0.5 * x.double() @ a[slot, 0].double().T @ b[slot, 0].double().T
            offset += s
        return y

    for _ in range(2):
        y = torch.zeros(n, sum(slices))
        cpu_lora.fast_add_lora_linear(wrapper, y, x, a_stacked, b_stacked, 0.5, slices)
        ref = reference(a_stacked, b_stacked)
        assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-5
        with torch.no_grad():  # a new adapter in the same slot, written in place
            for w in (*a_stacked, *b_stacked):
                w[slot].copy_(torch.randn_like(w[slot]))
    entries = len(cpu_lora._PACKS)
    with torch.inference_mode():  # weights vLLM made under inference_mode: built per call, still exact
        a_stacked, b_stacked = tuple(w.clone() for w in a_stacked), tuple(w.clone() for w in b_stacked)
    gc.collect()
    assert len(cpu_lora._PACKS) == entries - 1  # the layer's entries went with its tensors (a shut-down engine)
    y = torch.zeros(n, sum(slices))
    cpu_lora.fast_add_lora_linear(wrapper, y, x, a_stacked, b_stacked, 0.5, slices)
    ref = reference(a_stacked, b_stacked)
    assert float((y.double() - ref).abs().max() / ref.abs().max()) < 1e-5
    assert len(cpu_lora._PACKS) == entries - 1  # nothing kept for them


def test_uniform_slot_follows_vllms_index_buffer(ops):
    """The per-step memo of "every token uses slot k" is dropped when vLLM writes the next step's indices into its
    buffer (``copy_``, as ``PunicaWrapperBase._update_base_metadata``), also when the new indices mix adapters."""
    cpu_lora, _ = ops
    buffer = torch.empty(8, dtype=torch.long)  # vLLM's _token_lora_indices
    steps = [([1] * 5, 1), ([0, 1, 1, 0, 1], None), ([0] * 5, 0), ([-1] * 5, None), ([2] * 3, 2)]
    for written, slot in steps:
        buffer[: len(written)].copy_(torch.tensor(written))
        view = buffer[: len(written)]  # the token_lora_indices property: a new view each step
        assert cpu_lora._uniform_slot(view) == slot
        assert cpu_lora._uniform_slot(view) == slot  # memo hit
    with torch.inference_mode():  # prefill's exploded indices: no version counter, answered without the memo
        exploded = [torch.full((6,), 3), torch.tensor([3, 3, 0, 3, 3, 3])]
    assert [cpu_lora._uniform_slot(t) for t in exploded] == [3, None]

    # A later engine's buffer at the same address, length and version (two tensors over one array stand in for an
    # address the allocator handed out again): answered from its own indices, not from the other buffer's memo.
    import numpy as np

    memory = np.ones(5, dtype=np.int64)
    first = torch.from_numpy(memory)
    assert cpu_lora._uniform_slot(first) == 1
    memory[:] = 0
    later = torch.from_numpy(memory)
    assert (later.data_ptr(), later.numel(), later._version) == (first.data_ptr(), first.numel(), first._version)
    assert cpu_lora._uniform_slot(later) == 0
