"""The LM-head projection every log-prob route shares: which weight, which logit transform, which chunking, which
dtype, with autocast off.

A route hands :class:`Head` the hidden states it captured (or TRL handed its kernel) and the tokens to score;
:class:`Head` projects them through :mod:`slimrl.ops` in row chunks, so ``[N, V]`` logits never exist at once:

* **weight**: the head's full ``[V, H]`` matrix; an FSDP2-sharded head (a DTensor) is gathered with
  ``full_tensor()``, which all-gathers on the forward and reduce-scatters the gradient on the backward;
* **logit transform**: the model's logit scale and final soft-cap (:func:`slimrl.compat.heads.logit_transform`),
  and the trainer's temperature per call;
* **chunking**: the config's ``unsloth_num_chunks`` / ``unsloth_logit_chunk_multiplier`` (:func:`chunking_of`);
* **dtype**: the routes that capture the head's input run the projection in the head's dtype (the hidden states
  cast to it, as ``nn.Linear`` would see them) with an fp32 softmax, outside any autocast; TRL's fused-head kernel
  slot keeps TRL's rule (the op's compute dtype follows the caller's autocast), so :meth:`Head.outputs` takes
  ``in_head_dtype=False`` there;
* **kernel**: where TRL's own Triton kernel runs (TRL >= 1.15 on CUDA/XPU with Triton, :func:`trl_kernel`) it
  projects the rows the route selected, unless the config chose slimrl's chunking: it tiles the vocabulary with a
  fused online log-sum-exp, where slimrl's torch op re-reads the head once per row block, so on those devices a
  projection is never slower than TRL's. What slimrl's routes add stays theirs on every device (the rows they score:
  completion positions only, each prompt once in the shared-prefix layout; no logits kept between forward and
  backward); slimrl's op serves every other device and the chunking a user asks for.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from slimrl.compat.heads import logit_transform
from slimrl.ops.chunked_logprob import autocast_off, chunked_logprob_outputs, masked_token_logprobs
from slimrl.patching.every_trainer.extra_fields import fields_of
from slimrl.patching.machinery.registry import original

UTILS = "trl.trainer.utils"


def _trl_kernel_class() -> Any:
    """TRL's ``_ChunkedLogProbFunction`` as TRL has it (before slimrl's kernel swap, where installed); None before
    TRL 1.15."""
    try:
        return original(UTILS, "_ChunkedLogProbFunction")
    except RuntimeError:  # not swapped (GRPO's route does not swap it)
        import importlib

        return getattr(importlib.import_module(UTILS), "_ChunkedLogProbFunction", None)


def trl_kernel_is_best(device: torch.device) -> bool:
    """Whether TRL's Triton kernel runs on ``device`` (CUDA/XPU with Triton): already compact and tiled, so slimrl
    hands projections to it. TRL before 1.15 has no kernel; 1.15 has one without Triton only
    (``_ChunkedLogProbFunction = None``: its fused-head trainers cannot run on a CPU); 1.16 decides with
    ``_use_triton`` and falls back to torch elsewhere."""
    if _trl_kernel_class() is None:
        return False
    try:
        from trl.kernels.chunked_logprob import _use_triton
    except ImportError:  # TRL 1.15: the kernel module is Triton only
        return device.type in ("cuda", "xpu")
    return bool(_use_triton(device))


def trl_kernel(device: torch.device, head: Head) -> tuple[Any, int] | None:
    """(TRL's kernel class, its vocabulary tile) where it serves ``head``'s projections on ``device`` (the module
    docstring), else None."""
    if head.num_chunks != -1 or head.chunk_multiplier is not None or not trl_kernel_is_best(device):
        return None
    import trl.trainer.utils as utils

    return _trl_kernel_class(), getattr(utils, "_CHUNKED_LOGPROB_CHUNK_SIZE", 4096)


def chunking_of(args: Any) -> tuple[int, int | None]:
    """(``unsloth_num_chunks``, ``unsloth_logit_chunk_multiplier``) of a config; (-1, None) = automatic."""
    fields = fields_of(args)
    return fields.unsloth_num_chunks, fields.unsloth_logit_chunk_multiplier


def chunking_chosen(args: Any) -> bool:
    """Whether a config sets slimrl's chunking: slimrl's op then projects even where TRL's kernel would."""
    num_chunks, multiplier = chunking_of(args)
    return num_chunks != -1 or multiplier is not None


def full_tensor(t: torch.Tensor | None) -> torch.Tensor | None:
    """An FSDP2 DTensor gathered to the full tensor (differentiably); any other tensor as it is."""
    return t.full_tensor() if t is not None and hasattr(t, "full_tensor") else t


@dataclass(frozen=True)
class Head:
    """One LM head as the log-prob routes project it (see the module docstring)."""

    weight: torch.Tensor  # [V, H]
    bias: torch.Tensor | None = None  # [V]
    logit_scale: float = 1.0
    softcap: float | None = None
    num_chunks: int = -1
    chunk_multiplier: int | None = None

    @classmethod
    def of(cls, head: torch.nn.Linear, model_config: Any, args: Any) -> Head:
        """The head module of a model (its config for the logit transform), chunked as ``args`` says."""
        scale, softcap = logit_transform(model_config)
        return cls(full_tensor(head.weight), full_tensor(head.bias), scale, softcap, *chunking_of(args))

    def detached(self) -> Head:
        """The same head without gradient to its weights (metric-only projections)."""
        return Head(
            self.weight.detach(),
            None if self.bias is None else self.bias.detach(),
            self.logit_scale,
            self.softcap,
            self.num_chunks,
            self.chunk_multiplier,
        )

    def _context(self, hidden: torch.Tensor, in_head_dtype: bool):
        return autocast_off(hidden.device) if in_head_dtype else nullcontext()

    def outputs(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        outputs: tuple[str, ...] = ("log_probs",),
        in_head_dtype: bool = True,
    ) -> tuple:
        """``hidden [N, H]`` scored against ``targets [N]``:
        :func:`slimrl.ops.chunked_logprob.chunked_logprob_outputs`'s ``(log_probs [N], entropy, log_sum_sq_probs,
        mean_logits, is_top1)``, each None unless in ``outputs``."""
        with self._context(hidden, in_head_dtype):
            h = hidden.to(self.weight.dtype) if in_head_dtype else hidden
            trl = trl_kernel(hidden.device, self)
            if trl is not None:
                kernel, tile = trl
                return kernel.apply(
                    h,
                    self.weight,
                    self.bias,
                    targets,
                    float(temperature),
                    tile,
                    self.softcap,
                    float(self.logit_scale),
                    tuple(outputs),
                )
            return chunked_logprob_outputs(
                h,
                self.weight,
                targets,
                self.bias,
                float(temperature),
                outputs=outputs,
                num_chunks=self.num_chunks,
                chunk_multiplier=self.chunk_multiplier,
                logit_scale=float(self.logit_scale),
                softcap=self.softcap,
            )

    def masked(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        valid: torch.Tensor,
        temperature: float,
        with_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``hidden [B, T, H]`` scored against ``targets [B, T]`` where ``valid [B, T]``, in the head's dtype:
        ``(log-probs [B, T], entropies [B, T] | None)``, 0 where not valid."""
        if trl_kernel(hidden.device, self) is not None:  # the valid rows gathered, scattered back (as TRL does)
            wanted = ("log_probs", "entropy") if with_entropy else ("log_probs",)
            logps, entropy, *_ = self.outputs(hidden[valid], targets[valid], temperature, wanted)  # [N], [N] | None
            return (
                logps.new_zeros(valid.shape).masked_scatter(valid, logps),
                None if entropy is None else entropy.new_zeros(valid.shape).masked_scatter(valid, entropy),
            )
        with self._context(hidden, True):
            return masked_token_logprobs(
                hidden.to(self.weight.dtype),
                self.weight,
                targets,
                valid,
                self.bias,
                temperature,
                num_chunks=self.num_chunks,
                chunk_multiplier=self.chunk_multiplier,
                logit_scale=self.logit_scale,
                softcap=self.softcap,
                with_entropy=with_entropy,
            )
