"""What the accelerator here can do, in Unsloth's words."""

from __future__ import annotations

import torch


def is_bfloat16_supported() -> bool:
    """Unsloth's ``is_bfloat16_supported()``: a CUDA device with bf16 support (Ampere or newer). False on a CPU, as
    in Unsloth, so notebooks written ``bf16=is_bfloat16_supported(), fp16=not is_bfloat16_supported()`` ask for fp16
    here; the patched configs then train in the precision this machine runs (slimrl/patching/defaults.py)."""
    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
