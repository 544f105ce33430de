"""Seconds of a training pass on CUDA, phase by phase: what the first lease timed (the policy's log-prob pass with
gradients, the loss and the backward; no generation), for TRL alone, TRL + Liger and slimrl's default.

For ``T`` tokens through ``layers`` decoder layers of a dense LoRA model, with checkpointing (the backward
recomputes each layer's forward once, ``recompute``) and a backward of about twice a forward:

* **gemm**: ``2 N`` FLOPs per token forward (``N``: the decoder's linear weights), times ``1 + recompute + 2``, at
  :data:`slimrl.planning.timing.MATMUL_SHARE` of the card's dense 16-bit rate (:func:`timing.nominal`);
* **attention**: causal flash, ``4 h d`` FLOPs per (query, key) pair forward, 2.5 times that backward, at
  :data:`ATTENTION_SHARE` of the dense rate;
* **head**: ``2 H V`` FLOPs per scored token forward and once more backward (the head is frozen under LoRA: only
  the input gradient); where the ``[N, V]`` logits are built (TRL alone) :data:`LOGIT_PASSES` passes over them in
  fp32 (log-softmax, entropy, their backward);
* **elementwise**: the bytes each eager op reads and writes per token and layer (:func:`eager_bytes`: RMSNorm's fp32
  round trip, rotary embedding, SwiGLU, PEFT's LoRA glue -- the fp32 casts of the input, the scaling and the add --,
  the residual adds, K/V repeated for a padding mask), where Liger's kernels move each tensor once for the norm,
  the rotary embedding and SwiGLU; forward, recompute and each op's backward (:data:`BACKWARD`), at
  :data:`EW_SHARE` of the card's bandwidth;
* **launches**: :data:`KERNELS_PER_LAYER` kernels per layer and pass at :data:`timing.LAUNCH_SECONDS` each;
* **prefix** (slimrl's shared-prefix layout): each segment's keys and values moved (the prompt's gathered, the
  segment's own joined) and :data:`PREFIX_KERNELS_PER_LAYER` more kernels per layer and pass; what the layout saves
  is in the other phases (fewer tokens, fewer attention pairs). :func:`shared_prefix_pays` weighs the two.

Two constants are fitted, :data:`EW_SHARE` (0.70) and :data:`GEMM_SHARE` (0.84), on the lease's H200 rows of TRL
alone (1.44 s) and TRL + Liger (1.20 s) only (docs/BENCHMARKS.md "GPU": Qwen2.5-1.5B, LoRA r=64, 8 x (256 +
4,096); a grid of 0.01 minimising the two squared relative errors). Two rows and two constants are met exactly, so
those rows test nothing; Unsloth's row is the out-of-sample check (BENCHMARKS.md). The rest are counts or stated
assumptions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from slimrl.compat.gpus import Gpu
from slimrl.planning.settings import Settings
from slimrl.planning.timing import LAUNCH_SECONDS, MATMUL_SHARE, layout_work, nominal

GEMM_SHARE = 0.84  # of the dense rate the pass's GEMMs reach: fitted (module docstring)
ATTENTION_SHARE = 0.5  # of the dense rate flash attention reaches (assumed: about half, head dim 64-128)
LOGIT_PASSES = 6  # fp32 passes over materialised logits: log-softmax and entropy forward, their backward
KERNELS_PER_LAYER = 120  # eager kernels per decoder layer and pass with LoRA on its 7 projections
# the shared-prefix layout's own kernels per layer and pass (slimrl.ops.prefix_attention): the prompt's and the
# segments' attention calls where TRL's rows make one, the prompt's keys and values gathered per segment and joined
# to the segment's own, the position and index bookkeeping; their scatter and adds in the backward
PREFIX_KERNELS_PER_LAYER = 10
# the fused MLP's kernels per row chunk past the first (slimrl.ops.fused_mlp.row_chunks): forward (the product,
# the down projection and its adapter) and backward (the product's gradients and the five adapter GEMMs)
CHUNK_KERNELS = {"forward": 9, "backward": 25}
EW_SHARE = 0.70  # of the bandwidth eager elementwise ops reach: fitted (module docstring)
BYTES = 2  # 16-bit activations


@dataclass(frozen=True)
class Kernels:
    """What a side runs: ``liger`` (Liger's RMSNorm, rotary and SwiGLU), ``fused_lora`` (LoRA added into the base
    output with no fp32 copy), ``logits`` (the ``[N, V]`` logits built), ``repeat_kv`` (K/V repeated per query head)."""

    liger: bool = False
    fused_lora: bool = False
    logits: bool = True
    repeat_kv: bool = True


TRL = Kernels()
TRL_LIGER = Kernels(liger=True, logits=False)  # Liger's fused linear GRPO loss keeps a chunk of logits
SLIMRL = Kernels(logits=False, repeat_kv=False)  # the chunked head; flash takes grouped K/V as they are


def recompute_share(mode: str, every: int | None = None) -> float:
    """The share of decoder layers a checkpointing mode recomputes in the backward: none for ``"false"``, one in
    ``every`` (default 2) for ``"selective"``, all for the others (``true``, ``slimrl``, ``auto``)."""
    return 0.0 if mode == "false" else 1.0 / (every or 2) if mode == "selective" else 1.0


def run_shape(s: Settings, rows: int | None = None) -> dict[str, int]:
    """:func:`train_seconds`'s run keywords from a plan's settings (``rows``: the pass's rows, default the
    per-device batch)."""
    return dict(
        rows=rows or s.per_device_train_batch_size,
        generations=s.num_generations,
        prompt=s.max_prompt_length,
        completion=s.max_completion_length,
        lora_r=s.lora_r,
    )


def slimrl_kernels(fused_lora: bool) -> Kernels:
    """slimrl's side as it runs: its fused LoRA (``get_peft_model``'s ``fused_lora``, with an adapter) and, where
    liger-kernel is installed (the ``gpu`` extra), Liger's RMSNorm and RoPE (:mod:`slimrl.models.liger`)."""
    from slimrl.compat.liger import liger_installed

    return replace(SLIMRL, fused_lora=fused_lora, liger=liger_installed())


def _dims(config: Any) -> dict[str, int]:
    text = getattr(config, "text_config", None) or config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return {
        "layers": text.num_hidden_layers,
        "hidden": text.hidden_size,
        "inter": getattr(text, "intermediate_size", None) or 4 * text.hidden_size,
        "q": heads * head_dim,
        "kv": (getattr(text, "num_key_value_heads", None) or heads) * head_dim,
        "vocab": text.vocab_size,
    }


# backward bytes per forward byte, per op (autograd's own formulas): RMSNorm's backward recomputes the fp32 norm and
# reduces twice; SwiGLU's needs the sigmoid again; rotary, the LoRA glue, the residual adds and repeat_kv are linear
BACKWARD = {"norms": 3.0, "rope": 1.0, "swiglu": 2.0, "lora": 1.0, "residual": 1.0, "repeat": 1.0}


def eager_bytes(d: dict[str, int], k: Kernels) -> dict[str, int]:
    """Bytes read and written per token by one decoder layer's elementwise ops, forward, by op (module docstring)."""
    h, inter, q, kv = d["hidden"], d["inter"], d["q"], d["kv"]
    ins = 5 * h + q + inter  # the inputs of q, k, v, gate, up (hidden), o (q) and down (intermediate)
    outs = q + 2 * kv + 2 * h + 2 * inter  # their outputs
    return {
        # RMSNorm: to fp32 (r2 w4), pow (r4 w4), mean (r4), x * rsqrt (r4 w4), to bf16 (r4 w2), * weight (r2 w2)
        "norms": 2 * (4 * h if k.liger else 36 * h),
        # rotary on q and k: q * cos, rotate_half (negate, cat), * sin, add: about 24 bytes per element
        "rope": (4 if k.liger else 24) * (q + kv),
        "swiglu": (6 if k.liger else 10) * inter,  # silu(gate) (r2 w2), * up (r4 w2); fused r4 w2
        # PEFT: the input cast to the fp32 adapter (r2 w4) and back under autocast (r4 w2); * scaling (r2 w2), add
        # (r4 w2); fused: the add only (r2 r2 w2; a power-of-two scale, lora_alpha = r included, rides on B)
        "lora": 6 * outs if k.fused_lora else 12 * ins + 10 * outs,
        "residual": 2 * 6 * h,
        "repeat": 4 * (q + kv) if k.repeat_kv else 0,  # transformers' repeat_kv for K and V under a padding mask
    }


def linear_params(d: dict[str, int], lora_r: int) -> int:
    """The decoder's linear weights: q, k, v, o, gate, up, down per layer, and LoRA's A and B on each."""
    h, inter, q, kv = d["hidden"], d["inter"], d["q"], d["kv"]
    base = h * q + 2 * h * kv + q * h + 3 * h * inter
    lora = lora_r * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h))
    return d["layers"] * (base + lora)


def train_seconds(
    config: Any,
    gpu: Gpu,
    *,
    rows: int,
    generations: int,
    prompt: int,
    completion: int,
    lora_r: int,
    recompute: float,
    kernels: Kernels,
    shared_prefix: bool = False,
    tiled: bool = False,
) -> dict[str, float]:
    """Seconds per phase of one training pass on ``gpu`` (module docstring) over ``rows`` rows of ``prompt`` +
    ``completion`` tokens; ``shared_prefix``: each prompt once per group of ``generations`` rows (slimrl's layout:
    the prompt causal over itself, each completion over the prompt and itself); ``recompute``: the share of layers
    checkpointed; ``tiled``: the tiled MLP's one more MLP forward per layer in the backward."""
    d = _dims(config)
    tp = nominal(gpu)
    tokens, pairs = layout_work(rows, generations, prompt, completion, shared_prefix)
    scored = rows * completion
    passes = 1 + recompute + 2  # forward, recompute, backward (about two forwards)
    dense = tp.flops_per_s / MATMUL_SHARE  # the datasheet's dense rate
    split = {
        "gemm": passes * 2 * linear_params(d, lora_r) * tokens / (GEMM_SHARE * dense),
        "attention": (1 + recompute + 2.5) * 4 * d["q"] * pairs * d["layers"] / (ATTENTION_SHARE * dense),
        "head": 2 * 2 * d["hidden"] * d["vocab"] * scored / (GEMM_SHARE * dense),
        "elementwise": sum((1 + recompute + BACKWARD[op]) * n for op, n in eager_bytes(d, kernels).items())
        * tokens
        * d["layers"]
        / (EW_SHARE * tp.bytes_per_s),
        "launches": (1 + recompute + 1) * KERNELS_PER_LAYER * d["layers"] * LAUNCH_SECONDS,
    }
    if kernels.fused_lora:  # the fused MLP's product in row chunks: more, smaller kernels
        from slimrl.ops.fused_mlp import row_chunks

        more = len(row_chunks(tokens, d["inter"], d["hidden"])) - 1
        per_layer = CHUNK_KERNELS["forward"] * (1 + recompute) + CHUNK_KERNELS["backward"]
        split["launches"] += more * per_layer * d["layers"] * LAUNCH_SECONDS
    if shared_prefix:  # each segment's keys and values: the prompt's gathered, its own joined (read and write)
        moved = 2 * rows * (prompt + prompt + completion) * 2 * d["kv"] * BYTES * d["layers"]
        split["prefix"] = (1 + recompute + 1) * (
            moved / (EW_SHARE * tp.bytes_per_s) + PREFIX_KERNELS_PER_LAYER * d["layers"] * LAUNCH_SECONDS
        )
    if kernels.logits:
        split["head"] += LOGIT_PASSES * 4 * scored * d["vocab"] / tp.bytes_per_s
    if tiled:
        mlp_flops = 2 * 3 * d["hidden"] * d["inter"] * tokens * d["layers"]
        split["gemm"] += mlp_flops / (GEMM_SHARE * dense)
        split["elementwise"] += (10 + 12) * d["inter"] * tokens * d["layers"] / (EW_SHARE * tp.bytes_per_s)
    return split


def shared_prefix_pays(config: Any, gpu: Gpu, kernels: Kernels, **shape: Any) -> bool:
    """Whether the shared-prefix layout makes the pass faster on ``gpu``: the prompt tokens a group stops repeating
    against the layout's own traffic and launches (``shape``: :func:`train_seconds`'s rows, generations, prompt,
    completion, lora_r and recompute)."""
    packed = sum(train_seconds(config, gpu, kernels=kernels, shared_prefix=True, **shape).values())
    return packed < sum(train_seconds(config, gpu, kernels=kernels, shared_prefix=False, **shape).values())
