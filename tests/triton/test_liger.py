"""Liger-Kernel's RMSNorm, RoPE and SwiGLU as slimrl applies them (:mod:`slimrl.models.liger`), run on this CPU by
Triton's interpreter (``TRITON_INTERPRET=1``): the same ``@triton.jit`` kernels that run on CUDA, executed with numpy.

For the Llama, Qwen2, Qwen3, Mistral and Gemma 3 shapes, a LoRA model's logits, input gradient and every adapter
gradient with Liger's kernels against transformers' eager modules; then :func:`remove_liger` restores transformers'
modules exactly (bitwise the numbers from before, the modeling modules' names as they were).

Tolerance: 1e-5 relative, fp32 (Liger's kernels compute the same norm and rotation, one row per program, in fp32:
sums in another order; a whole two-layer model's chain of layers included).

Triton 3.9's interpreter passes a Python float argument to a kernel as a Python float, where compiled Triton makes
it an fp32 scalar (``eps.to(...)`` in Liger's RMSNorm needs the latter), and it has no CUDA libdevice (Liger's
RMSNorm calls libdevice's ``rsqrt``, its GeGLU libdevice's ``tanh``): the ``compiled_scalars`` fixture gives the
interpreter compiled Triton's conversion, and Triton's own ``tl.math.rsqrt`` and ``tanh(x) = 2 sigmoid(2x) - 1``
in libdevice's place.
"""

from __future__ import annotations

import copy
import os

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
pytest.importorskip("liger_kernel")
pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 (make test-triton)"
)

from tests.models.test_fused_lora import FAMILIES, _model, _model_run, _worst  # noqa: E402


@triton.jit
def _rsqrt(x):
    return tl.math.rsqrt(x)


@triton.jit
def _tanh(x):
    return 2 * tl.sigmoid(2 * x) - 1


@pytest.fixture(autouse=True)
def compiled_scalars(monkeypatch):
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    plain = interpreter._implicit_cvt

    def convert(arg):
        if isinstance(arg, float):  # compiled Triton: an fp32 scalar
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return plain(arg)

    monkeypatch.setattr(interpreter, "_implicit_cvt", convert)
    from liger_kernel.ops import geglu, rms_norm

    monkeypatch.setattr(rms_norm, "rsqrt", _rsqrt)  # CUDA's libdevice calls: the interpreter has no libdevice
    monkeypatch.setattr(geglu, "tanh", _tanh)


def _namespace(model):
    import sys

    module = sys.modules[type(model.get_base_model()).__module__]
    return dict(vars(module))


@pytest.mark.parametrize("model_type", list(FAMILIES))
@pytest.mark.parametrize("fused", [True, False], ids=["fused-mlp", "liger-swiglu"])
def test_liger_s_kernels_match_transformers_and_come_off_exactly(model_type, fused):
    from slimrl.models.fused_lora import fuse_lora
    from slimrl.models.liger import active_liger, apply_liger, remove_liger

    model = _model(model_type)
    if fused:
        fuse_lora(model)
    names = _namespace(model)
    theirs = _model_run(model)
    kernels = apply_liger(model, swiglu=not fused)
    mlp = "geglu" if model_type == "gemma3_text" else "swiglu"  # Gemma's gated MLP: Liger's GeGLU kernel
    assert set(kernels) == {"rms_norm", "rope"} | ({mlp} if not fused else set())
    assert active_liger(model) == kernels
    norm = model.get_base_model().model.norm
    assert "forward" in vars(norm)  # the instance runs Liger's forward
    ours = _model_run(model)
    assert _worst(ours, theirs) < 1e-5
    remove_liger(model)
    assert "forward" not in vars(norm) and active_liger(model) == ()
    after = _namespace(model)
    assert after.keys() == names.keys() and all(after[k] is names[k] for k in names)
    assert _worst(_model_run(model), theirs) == 0.0


def test_a_family_liger_does_not_know_keeps_transformers_modules():
    from slimrl.models.liger import apply_liger, liger_families

    assert "llama" in liger_families()
    model = _model("llama")
    model.get_base_model().config.model_type = "not-a-family"
    before = {id(m): dict(vars(m)) for m in model.modules()}
    assert apply_liger(model, swiglu=True) == ()
    assert all(dict(vars(m)) == before[id(m)] for m in model.modules())


def test_unpatch_takes_liger_off_every_model():
    from slimrl import PatchFastRL, unpatch
    from slimrl.models.liger import active_liger, apply_liger

    PatchFastRL()
    models = [_model("llama"), _model("qwen2")]
    for model in models:
        apply_liger(model, swiglu=True)
    twin = copy.deepcopy(models[0])
    unpatch()
    assert all(active_liger(m) == () for m in models)
    assert "forward" not in vars(models[0].get_base_model().model.norm)
    assert twin is not None
