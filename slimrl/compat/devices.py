"""What the accelerator here can do, in Unsloth's words."""

from __future__ import annotations

from slimrl.compat.gpus import native_bf16


def is_bfloat16_supported() -> bool:
    """Unsloth's ``is_bfloat16_supported()``: a CUDA device that does bf16 in hardware (compute capability >= 8.0,
    Ampere or newer; Unsloth's ``SUPPORTS_BFLOAT16``). False on a T4 or V100, where ``torch.cuda.is_bf16_supported()``
    says True because it counts emulation (and vLLM refuses bf16), so notebooks written
    ``bf16=is_bfloat16_supported(), fp16=not is_bfloat16_supported()`` train in fp16 there; False on a CPU, as in
    Unsloth, where the patched configs then train in the precision this machine runs
    (slimrl/patching/every_trainer/defaults.py)."""
    return native_bf16()
