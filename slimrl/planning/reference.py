"""The frozen reference model full fine-tuning keeps (DPO, KTO; GRPO/RLOO with ``beta > 0``): its bytes.

TRL builds that copy from the policy's path with ``create_model_from_path``, whose ``dtype`` defaults to
``"float32"`` unless ``model_init_kwargs`` says otherwise: 4 bytes per parameter beside bf16 weights (TRL v1.15.0's
published gemma-3-1b table: RLOO − GRPO is 3.72 GiB, the model's parameters × 4). A 4-bit base is rebuilt 4-bit
(its ``quantization_config``): the weights' own bytes. slimrl leaves the copy to TRL, so its plan counts the same.
"""

from __future__ import annotations

import torch

REFERENCE_DTYPE = torch.float32


def reference_bytes(weight_bytes: int, weight_dtype: torch.dtype, reference_dtype: torch.dtype | None = None,
                    load_in_4bit: bool = False) -> int:
    """The reference copy of weights of ``weight_bytes`` in ``weight_dtype`` built at ``reference_dtype``
    (default :data:`REFERENCE_DTYPE`; never below the weights' own size)."""
    if load_in_4bit:
        return weight_bytes
    return weight_bytes * max(1, (reference_dtype or REFERENCE_DTYPE).itemsize // weight_dtype.itemsize)
