"""TRL alone, and TRL + Liger, on the meta device: the other side of every ratio ``slimrl plan --compare`` prints.

One training step of a TRL trainer is run as TRL runs it on a CUDA GPU, at the real model's shape, on the meta device
(:mod:`slimrl.planning.trace`'s :class:`~slimrl.planning.trace.LiveBytes` counts what each op creates; nothing is
allocated): the real transformers model in bf16 with TRL's default gradient checkpointing (every layer,
non-reentrant), then the step's head and loss as the TRL release computes them, then the backward. What a CUDA run
holds that is not an op output is added: the weights, the AdamW state of the trained parameters (full fine-tuning:
two moments per weight in the weights' dtype, what ``torch.optim.AdamW`` keeps for bf16 parameters; LoRA: fp32
adapter, gradient and moments), and a frozen reference model where the trainer keeps one.

The head, per TRL release (:data:`FAMILIES`):

* ``full_logits`` (TRL <= 1.14): the model returns ``[rows, T, V]`` logits in bf16; the per-token log-probs and
  entropies come from TRL's Triton kernel over those logits (its launcher allocates four fp32 ``[rows, T]`` outputs;
  its backward a logits-sized gradient), SFT's ``nll`` from transformers' own loss (the logits upcast to fp32);
* ``fused_head`` (TRL >= 1.15): TRL's chunked LM head (``trl/kernels/chunked_logprob.py``): the scored positions'
  hidden states gathered into a copy, seven fp32 ``[N]`` accumulators and one ``[min(N, 4096), 32768]`` tile in the
  forward; in the backward an fp32 ``[N, H]`` input gradient, an fp32 ``[V, H]`` weight gradient when the head is
  trained, one tile, and the casts back;
* ``liger`` (TRL + Liger, ``use_liger_kernel=True``): Liger's fused linear losses: cross-entropy (SFT) in row chunks
  of ``2**ceil(log2(N / ceil(V / H)))`` with fp32 chunk logits and an fp32 ``[V, H]`` weight gradient; its
  preference and GRPO losses chunk by whole sequences (one ``[T, V]`` fp32 block per chunk).

The Triton launches themselves are not run (their memory is the tensors their launchers allocate, mimicked here);
attention is CUDA's SDPA: flash where transformers passes no mask, memory-efficient with the boolean mask turned into
an additive bias of the query's dtype where it passes one (Gemma 3's sliding-window layers; the conversion holds the
mask's ``logical_not`` for a moment: ``[T, T]`` bool + bf16 bias + that negation, 4 bytes per query-key pair at
once, besides the mask itself).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from slimrl.planning.phases import REFERENCE_DTYPE, reference_bytes
from slimrl.planning.settings import Workload
from slimrl.planning.trace import LiveBytes, _base, _state, cuda_attention

FAMILIES = ("full_logits", "fused_head", "liger")
TOKEN_CHUNK, VOCAB_CHUNK = 4096, 32768  # TRL's chunked head: tokens and vocabulary columns per tile


def family_of(trl_version: str, liger: bool = False) -> str:
    """The head TRL ``trl_version`` runs (``liger``: with ``use_liger_kernel=True``)."""
    from packaging.specifiers import SpecifierSet

    from slimrl.compat.trl_info import FUSED_HEAD  # the one place the fused head's releases are named

    fused = SpecifierSet(FUSED_HEAD).contains(str(trl_version), prereleases=True)
    return "liger" if liger else "fused_head" if fused else "full_logits"


@dataclass
class Step:
    """One simulated step: persistent bytes (weights, optimizer state, reference) and the traced peak of the pass."""

    trainer: str
    family: str
    tokens: int
    persistent: dict[str, int]
    pass_peak: int
    notes: list[str] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return sum(self.persistent.values()) + self.pass_peak


class _FusedHead(torch.autograd.Function):
    """TRL >= 1.15's chunked LM head, as its launcher allocates (module docstring): log-probs ``[N]`` fp32."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [N, H], [V, H]
        n = hidden.shape[0]
        stats = [torch.empty(n, dtype=torch.float32, device=hidden.device) for _ in range(7)]  # running max, sums
        tile = torch.empty(
            min(n, TOKEN_CHUNK), min(VOCAB_CHUNK, weight.shape[0]), dtype=hidden.dtype, device=hidden.device
        )  # [4096, 32768]
        log_z = torch.empty(n, dtype=torch.float32, device=hidden.device)
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)  # logprobs
        ctx.save_for_backward(hidden, weight, log_z)
        del stats, tile
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        hidden, weight, _ = ctx.saved_tensors
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)  # [N, H]
        grad_weight = (
            torch.empty(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        )  # [V, H]
        tile = torch.empty(
            min(hidden.shape[0], TOKEN_CHUNK),
            min(VOCAB_CHUNK, weight.shape[0]),
            dtype=hidden.dtype,
            device=hidden.device,
        )
        del tile
        return (grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype) if grad_weight is not None else None)


class _LogprobEntropyKernel(torch.autograd.Function):
    """TRL <= 1.14's log-prob + entropy kernel over materialised logits ``[rows, T, V]``: four fp32 ``[rows, T]``
    outputs; its backward a contiguous logits-sized gradient."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor) -> torch.Tensor:
        shape = logits.shape[:-1]
        outs = [torch.empty(shape, dtype=torch.float32, device=logits.device) for _ in range(4)]
        ctx.save_for_backward(logits, outs[2], outs[3])
        return outs[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, _, _ = ctx.saved_tensors
        return torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)


class _LigerChunks(torch.autograd.Function):
    """Liger's fused linear loss: rows projected ``chunk`` at a time into fp32 logits, the input gradient ``[N, H]``
    and (trained head) an fp32 weight gradient accumulated in the forward, replayed in the backward."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, chunk: int) -> torch.Tensor:
        n, v = hidden.shape[0], weight.shape[0]
        grad_input = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)  # [N, H]
        grad_weight = (
            torch.empty(weight.shape, dtype=torch.float32, device=hidden.device) if weight.requires_grad else None
        )  # [V, H]
        rows = min(chunk, n)
        logits = torch.empty(rows, v, dtype=hidden.dtype, device=hidden.device)  # [chunk, V]
        upcast = torch.empty(rows, v, dtype=torch.float32, device=hidden.device)  # [chunk, V]
        grad_logits = torch.empty(rows, v, dtype=torch.float32, device=hidden.device)  # [chunk, V]
        del logits, upcast, grad_logits
        ctx.save_for_backward(grad_input, *(() if grad_weight is None else (grad_weight,)))
        ctx.has_weight = grad_weight is not None
        return torch.empty((), dtype=torch.float32, device=hidden.device)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        saved = ctx.saved_tensors
        return saved[0], (saved[1].to(torch.bfloat16) if ctx.has_weight else None), None


def liger_chunk(rows: int, vocab: int, hidden: int) -> int:
    """Liger's row chunk for its fused linear cross-entropy."""
    return 2 ** math.ceil(math.log2(max(1, math.ceil(rows / math.ceil(vocab / hidden)))))


def simulate(
    config: Any,
    work: Workload,
    tokens: int,
    family: str,
    *,
    rows: int = 1,
    lora_r: int = 0,
    checkpointing: bool = True,
    reference: bool | None = None,
    device: str = "cuda",
    load_in_4bit: bool = False,
    reference_dtype: torch.dtype = REFERENCE_DTYPE,
) -> Step:
    """One step of the trainer of workload ``work`` (declared with its patches; ``work.trl``: TRL's step) on ``rows``
    sequences of ``tokens`` tokens (DPO: that many chosen and as many rejected; KTO: as many mismatched KL sequences
    besides), TRL's head of ``family``; ``reference`` overrides the trainer's default (``work.trl.default_reference``),
    ``reference_dtype`` the dtype TRL builds that copy in
    (:data:`REFERENCE_DTYPE`). ``device="cuda"``: bf16 and CUDA's attention (module docstring); ``"cpu"``: fp32,
    attention keeping only its output and log-sum-exp (what slimrl's planner assumes there). ``load_in_4bit``: the
    decoder's linear weights in NF4, as slimrl's planner counts them (QLoRA)."""
    from slimrl.planning import trace

    if not isinstance(work, Workload) or work.trl is None or family not in FAMILIES:
        raise ValueError(
            f"work {work!r} / family {family!r}: pass a trainer's Workload with its TRL step (trl) / "
            f"choose from {FAMILIES}"
        )
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = trace.meta_model(config, dtype, lora_r, checkpoint_every=1 if checkpointing else 0)
    if load_in_4bit:
        from slimrl.planning.plan import _weights

        weights = _weights(model, True, dtype)[0]
    else:
        weights = sum(p.numel() * p.element_size() for n, p in _unique(model) if "lora_" not in n)
    trained = [(n, p) for n, p in _unique(model) if p.requires_grad]
    persistent = {
        "weights": weights,
        "optimizer": 16 * sum(p.numel() for _, p in trained)
        if lora_r
        else 2 * sum(p.numel() * p.element_size() for _, p in trained),
    }
    keep_ref = work.trl.default_reference if reference is None else reference
    if keep_ref and not lora_r:  # LoRA: TRL scores the reference with the adapter disabled, no copy
        persistent["reference"] = reference_bytes(weights, dtype, reference_dtype, load_in_4bit)
    with cuda_attention(model, device), LiveBytes(_state(model)) as live:
        _step(model, work, tokens, family, rows, keep_ref)
    return Step(work.trl.name, family, tokens, persistent, live.peak)


def _unique(model: Any) -> list[tuple[str, torch.Tensor]]:
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def _step(model: Any, work: Workload, tokens: int, family: str, rows: int, reference: bool) -> None:
    """The step's passes (module docstring) and the backward of the policy's. What the trainer keeps referenced until
    its loss function returns stays live in the trace: the reference pass's outputs (DPO, KTO: ``ref_outputs``) and,
    with full logits, the copies its logit metrics make of the policy's logits."""
    trl = work.trl
    policy = 2 * rows if work.paired else rows  # chosen and rejected rows in one forward
    if trl.kl_pass:  # the KL pass: the policy on mismatched pairs, no gradient (its logits freed after)
        with torch.no_grad():
            _pass(model, rows, tokens, family, grad=False)
    held: list[torch.Tensor] = []  # [policy logits, reference logits] where the head materialises them
    loss = _pass(model, policy, tokens, family, grad=True, nll=trl.nll, keep=held)
    if reference:
        with torch.no_grad():
            if trl.kl_pass:  # the reference's KL pass, then its pass over the batch
                _pass(model, rows, tokens, family, grad=False)
            _pass(model, policy, tokens, family, grad=False, keep=held if trl.holds_reference_outputs else None)
    if held and trl.holds_reference_outputs:
        _logit_metrics(held[0], trl.metric_copies)
    del held
    loss.backward()


def _logit_metrics(logits: torch.Tensor, copies: bool) -> None:
    """TRL <= 1.14's ``logits/chosen`` and ``logits/rejected`` over the policy's ``[B, T, V]`` logits: DPO splits
    the batch into views and copies each half's completion positions by a boolean mask; KTO first copies the chosen
    and the rejected rows (``index_select``, both held) and then masks each. Every completion position is taken to
    be scored (the mask keeps all of them). ``copies``: KTO's way."""
    with torch.no_grad():
        shifted = logits[:, :-1].detach()  # [B, T-1, V]
        if not copies:
            halves = shifted.chunk(2, dim=0)  # views
        else:
            half = shifted.shape[0] // 2 or 1
            halves = (shifted[:half].clone(), shifted[half:].clone())  # index_select: copies
        for part in halves:
            masked = part.reshape(-1, part.shape[-1]).clone()  # part[mask.bool()]: [N, V]
            del masked
        del halves


def _accelerate_fp32(logits: torch.Tensor) -> torch.Tensor:
    """accelerate's mixed precision (``bf16=True``, TRL's default) wraps the prepared model's ``forward`` in autocast
    and ``convert_outputs_to_fp32``: the logits the trainer sees are an fp32 copy of the bf16 ones (which are then
    freed; the cast's backward keeps nothing)."""
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits


def _pass(
    model: Any, rows: int, tokens: int, family: str, grad: bool, nll: bool = False, keep: list | None = None
) -> torch.Tensor:
    """One forward over ``rows`` sequences through TRL's head of ``family``; a scalar to back-propagate. ``keep``:
    the pass's logits are appended (held by the caller) where the head materialises them."""
    base = _base(model)
    ids = torch.zeros(rows, tokens, dtype=torch.long, device="meta")  # [B, T]
    head = base.get_output_embeddings()
    if family == "full_logits":
        if nll:  # SFT's nll: transformers' own loss over the model's logits
            out = model(input_ids=ids, labels=ids, use_cache=False)
            logits = _accelerate_fp32(out.logits)  # [B, T, V] fp32
            loss = out.loss
            del out
            with torch.no_grad():  # TRL's entropy and accuracy metrics over the same logits
                metrics = _LogprobEntropyKernel.apply(logits[:, :-1].detach())
                top = logits[:, :-1].argmax(-1)
                del metrics, top
            return loss
        logits = _accelerate_fp32(model(input_ids=ids, use_cache=False).logits)  # [B, T, V] fp32
        if keep is not None:
            keep.append(logits)
        return _LogprobEntropyKernel.apply(logits[:, :-1]).sum()
    hidden = base.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state  # [B, T, H]
    scored = hidden[:, :-1].reshape(-1, hidden.size(-1)).clone()  # [N, H]: TRL's hidden_states[mask]
    del hidden
    if family == "fused_head":
        return _FusedHead.apply(scored, head.weight).sum()
    chunk = scored.shape[0] if not nll else liger_chunk(scored.shape[0], head.weight.shape[0], scored.shape[1])
    return _LigerChunks.apply(scored, head.weight, chunk if nll else tokens)
