"""The shared-prefix layout in the plan (``slimrl_shared_prefix``): where it applies, and the bytes of its attention
(:mod:`slimrl.ops.prefix_attention`) beyond what the packed rows' trace counts."""

from __future__ import annotations

from typing import Any

import torch

from slimrl.planning.settings import Settings


def shared_prefix_applies(config: Any, s: Settings) -> bool:
    """Whether the run's log-prob passes take the shared-prefix layout: asked for, declared by the trainer's
    workload, more than one completion per prompt, and a model the layout runs on
    (:func:`slimrl.ops.prefix_attention.model_reason`: family, soft-capping, a sliding window shorter than prompt +
    completion; the attention implementation is taken to be ``sdpa``, the default)."""
    from slimrl.ops.prefix_attention import model_reason

    work = s.workload
    if not (s.shared_prefix and work.generates and work.shared_prefix and s.num_generations > 1):
        return False
    return model_reason(config, s.max_prompt_length + s.max_completion_length) is None


def prefix_gather_bytes(config: Any, rows: int, prompt: int, completion: int, dtype: torch.dtype) -> int:
    """The shared-prefix attention's own bytes: one layer's segment keys and values, the prompt's gathered, repeated
    to every head (``2 x S x heads x (P + C) x head_dim``); its causal mask is PyTorch's lower-right bias, no tensor."""
    text = getattr(config, "text_config", None) or config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * rows * heads * (prompt + completion) * head_dim * dtype.itemsize
