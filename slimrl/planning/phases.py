"""The bytes a phase holds beyond what the meta-device trace counts (:mod:`slimrl.planning.trace`):

* **the shared-prefix layout** (``slimrl_shared_prefix``): where it applies, and the bytes of its attention
  (:mod:`slimrl.ops.prefix_attention`) beyond what the packed rows' trace counts;
* **the frozen reference model** full fine-tuning keeps (DPO, KTO; GRPO/RLOO with ``beta > 0``). TRL builds that copy
  from the policy's path with ``create_model_from_path``, whose ``dtype`` defaults to ``"float32"`` unless
  ``model_init_kwargs`` says otherwise: 4 bytes per parameter beside bf16 weights (TRL v1.15.0's published
  gemma-3-1b table: RLOO − GRPO is 3.72 GiB, the model's parameters × 4). A 4-bit base is rebuilt 4-bit (its
  ``quantization_config``): the weights' own bytes. slimrl leaves the copy to TRL, so its plan counts the same;
* **host memory** a CUDA run holds: the pinned pool of slimrl's offloaded checkpointing (:mod:`slimrl.models.offload`).
"""

from __future__ import annotations

from typing import Any

import torch

from slimrl.compat.memory import total_bytes
from slimrl.models.offload import GRANULE, PINNED_SHARE
from slimrl.planning.settings import Settings


def shared_prefix_applies(config: Any, s: Settings) -> bool:
    """Whether the run's log-prob passes take the shared-prefix layout: asked for, declared by the trainer's
    workload, more than one completion per prompt, a model the layout runs on
    (:func:`slimrl.ops.prefix_attention.model_reason`: family, soft-capping, a sliding window shorter than prompt +
    completion; the attention implementation is taken to be ``sdpa``, the default), and on CUDA where it pays."""
    from slimrl.ops.prefix_attention import model_reason

    work = s.workload
    if not (s.shared_prefix and work.generates and work.shared_prefix and s.num_generations > 1):
        return False
    if model_reason(config, s.max_prompt_length + s.max_completion_length) is not None:
        return False
    return s.device != "cuda" or _pays_on_cuda(config, s)


def _pays_on_cuda(config: Any, s: Settings) -> bool:
    """On CUDA the layout runs only where the training pass's time model says it is faster
    (:func:`slimrl.planning.cuda_pass.shared_prefix_pays`: the prompt tokens a group stops repeating against the
    layout's own traffic and launches)."""
    from slimrl.compat.gpus import current_gpu, find_gpu
    from slimrl.planning.cuda_pass import recompute_share, run_shape, shared_prefix_pays, slimrl_kernels
    from slimrl.planning.timing import DEFAULT_GPU

    return shared_prefix_pays(
        config,
        find_gpu(s.gpu) if s.gpu else current_gpu() or find_gpu(DEFAULT_GPU),
        slimrl_kernels(bool(s.fused_lora and s.lora_r)),
        **run_shape(s),
        recompute=recompute_share(s.gradient_checkpointing, s.checkpoint_every_n_layers),
    )


def prefix_gather_bytes(config: Any, rows: int, prompt: int, completion: int, dtype: torch.dtype) -> int:
    """The shared-prefix attention's own bytes: one layer's segment keys and values, the prompt's gathered, repeated
    to every head (``2 x S x heads x (P + C) x head_dim``); its causal mask is PyTorch's lower-right bias, no tensor."""
    text = getattr(config, "text_config", None) or config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * rows * heads * (prompt + completion) * head_dim * dtype.itemsize


REFERENCE_DTYPE = torch.float32


def reference_bytes(
    weight_bytes: int, weight_dtype: torch.dtype, reference_dtype: torch.dtype | None = None, load_in_4bit: bool = False
) -> int:
    """The reference copy of weights of ``weight_bytes`` in ``weight_dtype`` built at ``reference_dtype``
    (default :data:`REFERENCE_DTYPE`; never below the weights' own size)."""
    if load_in_4bit:
        return weight_bytes
    return weight_bytes * max(1, (reference_dtype or REFERENCE_DTYPE).itemsize // weight_dtype.itemsize)


def pinned_host_bytes(offloaded: int, buffers: int, notes: list[str], host_ram: int | None = None) -> int:
    """The pool's bytes for ``offloaded`` bytes of layer inputs in ``buffers`` buffers (each rounded up to the
    pool's granule); a note when they pass the share of ``host_ram`` (this machine's RAM by default) slimrl
    page-locks, past which they go to pageable memory."""
    if offloaded <= 0 or buffers <= 0:
        return 0
    per = -(-offloaded // buffers // GRANULE) * GRANULE
    held = per * buffers
    ram = host_ram or total_bytes(torch.device("cpu"))
    if held > pinnable_bytes(ram):
        notes.append(
            f"offloaded layer inputs: {held / 2**30:.1f} GiB of host memory, more than the "
            f"{PINNED_SHARE:.0%} of {ram / 2**30:.1f} GiB of RAM slimrl page-locks: the rest are copied "
            f"through pageable memory (slower); shorter completions or fewer rows keep them pinned"
        )
    return held


def pinnable_bytes(host_ram: int | None = None) -> int:
    """The host memory slimrl page-locks for offloaded layer inputs: its share of ``host_ram`` (this machine's RAM by
    default); the rest go through pageable memory."""
    return int(PINNED_SHARE * (host_ram or total_bytes(torch.device("cpu"))))
