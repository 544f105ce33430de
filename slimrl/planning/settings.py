"""What the planner is asked: a trainer's :class:`Workload` (what one of its steps does, declared next to its patches)
and the :class:`Settings` of one run, with the checks that refuse what no run could be (one line naming the
option). Small on purpose: the patching layer imports :class:`Workload` from here, not the planner."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from slimrl.errors import InputError

CHECKPOINTING = ("auto", "true", "false", "slimrl", "selective")


@dataclass(frozen=True)
class TrlStep:
    """One step of a trainer as TRL alone runs it, what :mod:`slimrl.planning.baseline` simulates (the other side of
    ``slimrl plan --compare``); each trainer declares its own in its :class:`Workload` (``trl``)."""

    name: str  # the trainer, for labels (its chosen and rejected rows: the Workload's ``paired``)
    kl_pass: bool = False  # a no-grad pass over mismatched pairs before the policy's, the reference's too (KTO)
    holds_reference_outputs: bool = False  # the reference's outputs and the logit metrics live until the loss returns
    metric_copies: bool = False  # those metrics copy the chosen and rejected rows first (KTO's index_select)
    nll: bool = False  # the loss is transformers' own cross entropy (SFT's nll)
    default_reference: bool = False  # TRL's defaults keep a frozen reference model (RLOO's beta 0.05, DPO, KTO)


@dataclass(frozen=True)
class Workload:
    """What one step of a trainer does, as far as memory and time go. Each trainer declares its own next to its
    patches (``TrainerSpec.workload`` in :mod:`slimrl.patching.table`); the default is GRPO's."""

    generates: bool = True  # samples its completions (a generation phase, num_generations rows per prompt)
    paired: bool = False  # chosen and rejected rows in one forward (twice the rows)
    reference: str = "beta"  # a frozen reference's no-grad pass: "always", "beta" (when beta > 0) or "never"
    entropy: bool = True  # the policy's log-prob pass also computes entropies
    shared_prefix: bool = True  # generating, its log-prob passes pack each prompt once per group (slimrl_shared_prefix)
    trl: TrlStep | None = None  # TRL alone's step, for --compare (None: not simulated)

    def keeps_reference(self, beta: float) -> bool:
        """Whether a step scores a frozen reference model at this KL coefficient."""
        return self.reference == "always" or (self.reference == "beta" and beta > 0)


def _option(default: object, text: str) -> object:
    """A field that is also a ``slimrl plan`` option (``--<name>``, help ``text``; the CLI is generated from these)."""
    return field(default=default, metadata={"option": text})


@dataclass(frozen=True)
class Settings:
    """One run as :func:`plan` sees it (``slimrl plan``'s options are the fields declared with :func:`_option`;
    auto-fit fills it from the trainer's config)."""

    algorithm: str = _option("grpo", "the trainer (default grpo)")  # slimrl plan's help lists the planned ones
    workload: Workload = field(default_factory=Workload)
    per_device_train_batch_size: int = _option(8, "rows per device and step")
    num_generations: int = _option(8, "completions per prompt (generating trainers)")
    max_prompt_length: int = _option(64, "prompt tokens")
    max_completion_length: int = _option(256, "completion tokens")
    lora_r: int = _option(16, "LoRA rank; 0 = full fine-tuning")
    load_in_4bit: bool = _option(False, "NF4 base weights (QLoRA)")
    gradient_checkpointing: str = _option(
        "auto",
        "auto (default: every layer, on CUDA offloaded only where needed), true, false, slimrl (offloaded on CUDA) "
        "or selective",
    )
    checkpoint_every_n_layers: int | None = None  # selective: the period (default 2)
    fast_inference: bool = _option(False, "generation through slimrl's colocated vLLM engine")
    device: str = _option("cpu", "cpu (default) or cuda")
    beta: float = _option(0.0, "KL coefficient (> 0 adds the reference pass)")
    unsloth_grpo_mini_batch: int | None = None
    gpu_memory_utilization: float = 0.5
    chunk_rows: int | None = None  # rows per head chunk (None: as the op chooses)
    shared_prefix: bool = _option(
        True,
        "slimrl_shared_prefix: each prompt once per group in the log-prob passes "
        "where the layout applies (GRPO; default true)",
    )
    tiled_mlp: bool | None = _option(
        None,
        "unsloth_tiled_mlp: the MLPs run a tile of hidden_size tokens at a time, "
        "checkpointed per tile; auto (default): slimrl's default, tiles on CUDA where "
        "they save >= 10 %% of the peak",
    )
    fused_lora: bool = _option(
        True,
        "get_peft_model's fused_lora: the LoRA projections and gated MLPs through slimrl's fused ops (default true)",
    )
    gpu: str | None = None  # a GPU of slimrl's table (its key): the dtype the model loads in there
    host_pinning: bool = True  # offload copies overlap (slimrl.compat.page_lock); False: pageable, synchronous


MAX_SIZE = 2**24  # rows or tokens: beyond any run, and below the integer overflow of a [rows, tokens] tensor
MAX_LORA_RANK = 65536  # beyond any model's width


def _check(s: Settings) -> None:
    if not isinstance(s.workload, Workload) or s.workload.reference not in ("always", "beta", "never"):
        raise InputError(f"workload {s.workload!r}: pass a Workload (reference 'always', 'beta' or 'never')")
    if s.gradient_checkpointing not in CHECKPOINTING:
        raise InputError(
            f"--gradient_checkpointing {s.gradient_checkpointing!r}: choose one of {', '.join(CHECKPOINTING)}"
        )
    if s.device not in ("cpu", "cuda"):
        raise InputError(f"--device {s.device!r}: choose cpu or cuda")
    for name in ("per_device_train_batch_size", "num_generations", "max_prompt_length", "max_completion_length"):
        value = getattr(s, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"--{name} {value!r}: must be a positive integer")
        if value > MAX_SIZE:
            raise InputError(f"--{name} {value}: larger than any run ({MAX_SIZE:,} at most)")
    if not isinstance(s.beta, int | float) or not math.isfinite(s.beta) or s.beta < 0:
        raise InputError(f"--beta {s.beta!r}: the KL coefficient is a number >= 0 (0: no reference model)")
    if not isinstance(s.shared_prefix, bool):
        raise InputError(f"--shared_prefix {s.shared_prefix!r}: write true or false")
    if not isinstance(s.fused_lora, bool):
        raise InputError(f"--fused_lora {s.fused_lora!r}: write true or false")
    if s.tiled_mlp is not None and not isinstance(s.tiled_mlp, bool):
        raise InputError(f"--tiled_mlp {s.tiled_mlp!r}: write true, false or auto")
    if not isinstance(s.lora_r, int) or isinstance(s.lora_r, bool) or not 0 <= s.lora_r <= MAX_LORA_RANK:
        # beyond any model's width the planner would describe absurd tensors
        raise InputError(f"--lora_r {s.lora_r!r}: a LoRA rank in [1, {MAX_LORA_RANK}], or 0 for full fine-tuning")
