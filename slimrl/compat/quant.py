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


def has_dense_weight(module: object) -> bool:
    """Whether :func:`dense_weight` knows ``module``'s kind (checked without dequantising)."""
    import torch

    kind = type(module)
    return kind is torch.nn.Linear or (kind.__name__ == "Linear4bit" and kind.__module__.startswith("bitsandbytes"))


def dense_weight(module: object, dtype: object) -> object | None:
    """The ``[out, in]`` weight of a linear base layer in ``dtype``: an ``nn.Linear``'s own, a bitsandbytes
    ``Linear4bit``'s dequantised (as bitsandbytes' own 4-bit matmul dequantises it for more than one token);
    None for any other layer (8-bit, a quantizer this does not know)."""
    import torch

    if type(module) is torch.nn.Linear:
        return module.weight.to(dtype)
    if has_dense_weight(module):
        import bitsandbytes.functional as bnb_f

        weight = module.weight
        return bnb_f.dequantize_4bit(weight.data, weight.quant_state).to(dtype)
    return None
