"""Keep bitsandbytes-quantized layers trainable and generating from the same numbers as training.

Two behaviours of bitsandbytes (>= 0.49, CPU backend) that silently break RL training on a quantized base, and what
slimrl does about each (one function, :func:`keep_quantized_trainable`, called wherever a model is about to be
trained or to generate for training: ``FastLanguageModel.from_pretrained`` / ``get_peft_model``, ``for_inference``
and every patched trainer's ``__init__``):

* ``Linear4bit`` in eval mode, on a no-grad input, on a CPU with AVX512-BF16, **repacks its weight in place** for a
  bf16 inference kernel (``bitsandbytes::gemv_4bit``) and keeps it so. That kernel has no autograd: every later
  backward through the layer returns a wrong input gradient (PyTorch only warns "an autograd kernel was not
  registered ... silently incorrect behavior"), so all LoRA gradients below the last 4-bit layer are wrong while the
  loss looks normal. The repacking also rounds the block scales to bf16. slimrl turns that repacking off on every
  ``Linear4bit`` (``support_avx512bf16_for_cpu = False``: generation then runs the same dequantize-and-matmul path
  as training) and unpacks a layer that was already repacked before slimrl saw it (the nibble layout exactly; the
  scales keep their bf16 rounding, which cannot be undone, and a warning says so).
* ``Linear8bitLt`` in eval mode on a CPU quantizes its *activations* to int8 (``MatMul8bitLt``) while in training
  mode it dequantizes the weight (``MatMul8bitFp``): generation in eval mode would sample from a slightly different
  model than the one the loss scores. :func:`quantized_modules` lets ``for_inference`` leave these layers in
  training mode (their only use of the flag is that choice), so the sampled tokens' log-probs are the training
  model's, as with TRL alone, which never switches the model to eval for generation.

Nothing here imports bitsandbytes: a model can only hold its layers if it is already imported.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch

from slimrl.compat.runtime.callsite import warn

# bitsandbytes' CPU repacking works in blocks of this many output rows, two 4-bit values per byte, 32 bytes of low
# nibbles then 32 of high nibbles per 64-value group.
_BLOCK_N = 32
_HALF = 32


def quantized_modules(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """``(name, module)`` for every bitsandbytes ``Linear4bit`` / ``Linear8bitLt`` in ``model``."""
    bnb = sys.modules.get("bitsandbytes.nn")
    if bnb is None:
        return
    kinds = tuple(k for k in (getattr(bnb, "Linear4bit", None), getattr(bnb, "Linear8bitLt", None)) if k)
    for name, module in model.named_modules():
        if isinstance(module, kinds):
            yield name, module


def is_cpu_packed(module: torch.nn.Module) -> bool:
    """Whether a ``Linear4bit``'s weight is in bitsandbytes' CPU inference layout (no autograd)."""
    state = getattr(getattr(module, "weight", None), "quant_state", None)
    return bool(getattr(state, "packing_format_for_cpu", False))


def unpack_cpu_weight(packed: torch.Tensor, state) -> torch.Tensor:
    """Undo bitsandbytes' CPU repacking of one 4-bit weight, in place on ``state``; returns the weight's storage in
    the training layout.

    Packed: ``[N, K/2]`` uint8 where each group of 64 values (2 adjacent columns of 32 consecutive rows) is stored
    as 32 bytes whose low nibbles are its first 32 values and whose high nibbles are the other 32; scales
    ``[K/blocksize, N]`` bf16. Training layout: the ``N*K`` values row-major, two per byte (high nibble first);
    scales ``[N*K/blocksize]``, kept as fp32 without double quantization (re-quantizing them would move the weights
    again).
    """
    n, k = state.shape
    nibbles = packed.reshape(-1, _HALF)  # [N*K/64, 32]
    groups = torch.cat([nibbles & 0xF, nibbles >> 4], dim=-1)  # [N*K/64, 64]
    values = groups.reshape(n // _BLOCK_N, k // 2, _BLOCK_N, 2).transpose(1, 2).reshape(-1)  # [N*K], row-major
    pairs = values.reshape(-1, 2)  # [N*K/2, 2]
    storage = ((pairs[:, 0] << 4) | pairs[:, 1]).to(torch.uint8)  # [N*K/2]
    storage = storage.reshape(getattr(state, "original_qshape", (n * k // 2, 1)))
    original = getattr(state, "original_storage_type", None)
    if original is not None and original != torch.uint8:
        storage = storage.view(original)
    state.absmax = state.absmax.T.reshape(-1).float().contiguous()  # [K/bs, N] -> [N*K/bs]
    state.nested = False
    state.dtype = getattr(state, "original_dtype", state.dtype)
    state.packing_format_for_cpu = False
    return storage


def keep_quantized_trainable(model: torch.nn.Module | None) -> int:
    """Turn off the 4-bit CPU repacking on every ``Linear4bit`` of ``model`` and unpack those already repacked (see
    the module docstring). Returns how many layers were unpacked; warns once when any were."""
    if model is None:
        return 0
    unpacked = []
    for name, module in quantized_modules(model):
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
        if is_cpu_packed(module):
            weight = module.weight
            weight.data = unpack_cpu_weight(weight.data, weight.quant_state)
            if getattr(module, "quant_state", None) is not None:
                module.quant_state = weight.quant_state
            unpacked.append(name)
    if unpacked:
        warn(
            f"{len(unpacked)} 4-bit layers (first: {unpacked[0]}) had been repacked by bitsandbytes for its CPU "
            f"inference kernel (the model ran in eval mode before slimrl saw it), which has no gradient; slimrl "
            f"unpacked them for training, their block scales keep the bf16 rounding that repacking applied. Load the "
            f"model with FastLanguageModel.from_pretrained (or pass it to the trainer before any eval-mode forward) to "
            f"keep the original scales"
        )
    return len(unpacked)


def keep_8bit_training_mode(model: torch.nn.Module) -> None:
    """Put every ``Linear8bitLt`` back in training mode (after ``model.eval()``): on a CPU its eval mode quantizes
    the activations, so generation would sample from a different model than training scores."""
    kind = getattr(sys.modules.get("bitsandbytes.nn"), "Linear8bitLt", None)
    if kind is None:
        return
    for _, module in quantized_modules(model):
        if isinstance(module, kind):
            module.training = True
