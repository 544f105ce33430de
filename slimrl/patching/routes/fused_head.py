"""The fused-head route: one kernel swap for every TRL >= 1.15 trainer built on TRL's fused LM head (DPO, KTO, SFT,
RLOO, GRPO's calls left to TRL: the trainers whose row, ``SPEC`` in :mod:`slimrl.patching.trainers`, names this
route).

These trainers call ``add_fused_lm_head`` on the policy (and reference) model and then ``model(...,
fused_lm_head=True)``; the patched forward (``trl.trainer.utils.add_fused_lm_head._fused_forward``) looks up two
``trl.trainer.utils`` module globals *at call time*:

| TRL attribute                               | replaced by                                   |
|---------------------------------------------|-----------------------------------------------|
| ``trl.trainer.utils._ChunkedLogProbFunction`` | :class:`SlimrlChunkedLogProbFunction`         |
| ``trl.trainer.utils._use_triton``           | :func:`slimrl_score_valid_positions_only`     |

What changes, and why it helps. Off Triton devices (CPU, MPS, ...) TRL 1.16 scores *every* position, prompt and padding
included, in fp32 tiles of 4096 tokens x 32768 vocabulary entries (512 MiB per tile, with three or four such temporaries
alive in its torch fallback). With the patches, only positions with a label (the completion tokens) are gathered and
projected, through :func:`slimrl.ops.chunked_logprob.chunked_logprob_outputs` in row blocks sized from free memory (<=
64 MiB of fp32 logits each). On CUDA/XPU with Triton, TRL's own kernel is already compact and tiled, so the call is
handed back to it unchanged (its Triton kernels are not something to redo in torch), unless the running trainer's config
sets ``unsloth_num_chunks`` or ``unsloth_logit_chunk_multiplier``: then slimrl's kernel runs with that chunking, on
every device. The config is read from :func:`slimrl.patching.every_trainer.steps.current_args` (each of these trainers'
``training_step`` / ``prediction_step`` is wrapped to set it), since TRL calls the kernel without the trainer.

The math is the same (same log-softmax under temperature, soft-cap and logit scale; same entropy, WPO
``log_sum_sq_probs``, ``mean_logits`` and ``is_top1`` metrics), so every loss type of these trainers is TRL's
own code, fed the same numbers. GRPO's own log-prob method (:mod:`slimrl.patching.trainers.grpo`) projects the captured
LM-head input itself (the method-capture route); only the calls it hands back to TRL (images, the MoE aux loss, a LoRA
head) reach this kernel.
"""

from __future__ import annotations

import torch

from slimrl.compat.trl_info import FUSED_HEAD
from slimrl.patching.every_trainer.extra_fields import CHUNK_FIELDS
from slimrl.patching.every_trainer.state import trainer_state
from slimrl.patching.every_trainer.steps import current_args, current_trainer, prediction_step_factory
from slimrl.patching.machinery.registry import Patch, original
from slimrl.patching.routes.head import UTILS, Head, chunking_chosen, chunking_of
from slimrl.patching.routes.head import trl_kernel_is_best as _trl_kernel_is_best
from slimrl.patching.spec import Route


class SlimrlChunkedLogProbFunction:
    """Drop-in for ``trl.trainer.utils._ChunkedLogProbFunction`` (only ``apply`` is ever called).

    ``apply(hidden [N, H], weight [V, H], bias [V] | None, targets [N], temperature, chunk_size, softcap,
    logit_scale, outputs) -> (log_probs [N], entropy | None, log_sum_sq_probs | None, mean_logits | None,
    is_top1 | None)`` — TRL's contract (the registry hands any other call, such as TRL 1.17's with a kept set,
    ``support_ids``, to TRL's kernel: :mod:`slimrl.patching.machinery.contracts`). ``chunk_size`` is TRL's
    vocabulary tile; slimrl chunks rows instead:
    ``unsloth_num_chunks`` / ``unsloth_logit_chunk_multiplier`` of the running trainer choose them
    (:func:`chunking_of`). The calls slimrl's kernel serves are counted in the running trainer's state.
    """

    @staticmethod
    def apply(
        hidden,
        weight,
        bias,
        targets,
        temperature,
        chunk_size,
        final_logit_softcapping=None,
        logit_scale=1.0,
        outputs=("log_probs",),
    ):
        args = current_args()
        if not takes_projection(args, hidden.device):
            return original(UTILS, "_ChunkedLogProbFunction").apply(
                hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping, logit_scale, outputs
            )
        trainer = current_trainer()
        if trainer is not None:
            trainer_state(trainer).served_calls += 1
        head = Head(weight, bias, float(logit_scale), final_logit_softcapping, *chunking_of(args))
        return head.outputs(hidden, targets, float(temperature), tuple(outputs), in_head_dtype=False)


def slimrl_score_valid_positions_only(device: torch.device) -> bool:
    """Replaces ``trl.trainer.utils._use_triton`` where the fused forward asks it whether to gather the valid
    (label != -100) positions before projecting: always yes, since slimrl's kernel has no recompilation cost for
    a varying row count. (The name is only read by ``_fused_forward`` in that module.)"""
    return True


def kernel_patches(algorithms: tuple[str, ...]) -> list[Patch]:
    """The kernel swap, shared by ``algorithms`` (installed while any of them is patched)."""
    # TRL 1.17 passes the sampler's kept token set as a tenth argument (`support_ids`, unbiased importance sampling
    # under top-k/top-p/min-p): a call without one (None) is the call this kernel serves; one with a kept set goes
    # to TRL's kernel, which renormalises over it (slimrl.patching.machinery.contracts)
    return [
        Patch(
            algorithms,
            UTILS,
            "_ChunkedLogProbFunction",
            SlimrlChunkedLogProbFunction,
            versions=FUSED_HEAD,
            member="apply",
            later=(("support_ids", None),),
        ),
        # TRL 1.15 always gathers the valid positions (no `_use_triton` to answer there)
        Patch(algorithms, UTILS, "_use_triton", slimrl_score_valid_positions_only, versions=FUSED_HEAD, optional=True),
    ]


def prediction_step_patch(algorithm: str, trainer: str) -> Patch:
    """A fused-head trainer's evaluation runs inside :func:`slimrl.patching.every_trainer.steps.running` too (its
    ``training_step`` wrapper already does), so the kernel reads the config's chunking there as well."""
    return Patch(
        algorithm, trainer, "prediction_step", prediction_step_factory, wrap=True, versions=FUSED_HEAD, passthrough=True
    )


def takes_projection(args, device: torch.device) -> bool:
    """Whether slimrl's kernel projects a run's rows: it hands them to TRL's Triton kernel where that kernel runs
    and the config chose no chunking of slimrl's (the kernel's own test above)."""
    return chunking_chosen(args) or not _trl_kernel_is_best(device)


ROUTE = Route(
    "fused head",
    "TRL's fused LM head with slimrl's kernel: labelled positions only, small row blocks (routes/fused_head.py)",
    releases=FUSED_HEAD,
    shared=kernel_patches,
    fields=CHUNK_FIELDS,
    applies=takes_projection,
)
