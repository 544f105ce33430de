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

    was_installed = bool(cpu_lora._ORIGINALS)
    cpu_lora.uninstall()
    originals = {n: getattr(lora_ops, n) for n in ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")}
    cpu_lora.install()
    yield cpu_lora, originals
    if not was_installed:
        cpu_lora.uninstall()


@pytest.mark.parametrize("indices", [[1, 1, 1, 1, 1], [0, 1, 1, 0, 1], [-1, -1, 1, 1, 1]],
                         ids=["one-adapter", "two-adapters", "some-without"])
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
        ref[t, 32:32 + out] += h[t].double() @ b[i, 0].double().T
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

    was_installed = bool(cpu_lora._ORIGINALS)  # an engine started earlier in this process installs it
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
