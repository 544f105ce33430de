"""Whether bitsandbytes can run here."""

from __future__ import annotations

BNB_CPU_MIN = "0.50.0"  # bitsandbytes runs NF4, LLM.int8() and its 8-bit optimizers on CPU from this release
NF4_BYTES = 0.516  # 4 bits + one 8-bit absmax per 64 weights + one fp32 per 256 absmax blocks (double quant)


def bitsandbytes_works() -> bool:
    """bitsandbytes is importable and can run here: any CUDA device, or a CPU with bitsandbytes >= 0.50."""
    import torch

    try:
        import bitsandbytes
    except Exception:  # noqa: BLE001 - a build that does not import beside this torch counts as missing
        return False
    if torch.cuda.is_available():
        return True
    from packaging.version import Version

    return Version(bitsandbytes.__version__) >= Version(BNB_CPU_MIN)
