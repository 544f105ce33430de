"""docs/BENCHMARKS.md's "GPU, predicted" rows: slimrl's plan beside TRL 1.16 alone and TRL + Liger simulated on the
meta device (``python bench/gpu_predict.py predict``). Every figure is a prediction; the simulation's error against
TRL's published GPU measurements is in ``python bench/gpu_predict.py validate``.

Each row: GRPO (or the validation's trainers), bf16 on CUDA, TRL's default gradient checkpointing on TRL's sides and
slimrl's defaults on slimrl's (offloaded checkpointing; the MLPs tiled where the plan says it pays,
``slimrl.planning.levers``) — and slimrl again with ``unsloth_tiled_mlp=False`` ("slimrl untiled") —, the step's
scoring and backward (generation: the same HF-generate KV cache on every side, included),
``per_device_train_batch_size = num_generations`` (one prompt's group per step). Every peak is of allocated bytes
(``max_memory_allocated``: the CUDA context not included). "floor": what any exact run must hold at once — the
weights, the adapter with its gradients and AdamW state, and the KV cache of the sequences it samples. The longest
completions in a budget are those whose verdict is "fits" (``slimrl.planning.verdict``) on every side.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

GIB = 2**30
TOP = 262144  # the longest completion the length searches try (tokens)
SHAPES = {
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=1 << 20,
    ),
    "qwen3-8b": dict(
        model_type="qwen3",
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=1 << 20,
    ),
    "llama-3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=1 << 20,
    ),
}
# (label, shape, settings): per_device_train_batch_size = num_generations = 8 unless given
ROWS = [
    (
        "Qwen2.5-1.5B bf16 LoRA r=64, 8 x 4,096",
        "qwen2.5-1.5b",
        dict(max_prompt_length=256, max_completion_length=4096, lora_r=64),
    ),
    (
        "Qwen3-8B QLoRA r=64, 8 x 8,192",
        "qwen3-8b",
        dict(max_prompt_length=256, max_completion_length=8192, lora_r=64, load_in_4bit=True),
    ),
    (
        "Qwen3-8B QLoRA r=64, one 110K-token sequence per micro-batch (Unsloth's 110K on 80 GB)",
        "qwen3-8b",
        dict(
            max_prompt_length=1024,
            max_completion_length=109 * 1024,
            lora_r=64,
            load_in_4bit=True,
            per_device_train_batch_size=1,
            num_generations=1,
        ),
    ),
    (
        "Llama-3.1-8B QLoRA r=64, 8 x 20K (Unsloth's estimate: 54.3 GB Unsloth, 510.8 GB TRL + FA2)",
        "llama-3.1-8b",
        dict(max_prompt_length=512, max_completion_length=20 * 1024 - 512, lora_r=64, load_in_4bit=True),
    ),
]


def config_of(shape: str):
    from transformers import AutoConfig

    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config._attn_implementation = "sdpa"
    return config


def settings_of(extra: dict):
    from slimrl.patching.table import PLANNED
    from slimrl.planning.settings import Settings

    base = dict(
        workload=PLANNED["grpo"],
        per_device_train_batch_size=8,
        num_generations=8,
        device="cuda",
        gradient_checkpointing="slimrl",
    )
    return Settings(**{**base, **extra})


def sides(config, s) -> dict[str, dict]:
    """slimrl, TRL 1.16 alone and TRL + Liger for settings ``s`` (TRL's sides with TRL's checkpointing)."""
    from slimrl.planning.compare import trl_side
    from slimrl.planning.plan import plan

    ours = plan(config, s, search=False)
    whole = plan(config, replace(s, tiled_mlp=False), search=False)  # from_pretrained(unsloth_tiled_mlp=False)
    generation = ours.phases.get("generation", 0)
    trl_s = replace(s, gradient_checkpointing="true")
    out = {
        "slimrl": {"peak_bytes": ours.peak_bytes, "phases": ours.phases},
        "slimrl untiled": {"peak_bytes": whole.peak_bytes, "phases": whole.phases},
    }
    for name, family in (("trl 1.16", "fused_head"), ("trl + liger", "liger")):
        out[name] = trl_side(config, trl_s, family, generation)
    floor = sum(ours.phases.get(k, 0) for k in ("weights", "adapter_and_optimizer", "generation"))
    out["floor"] = {"peak_bytes": floor, "phases": {}}
    return out


def longest(config, s, budget: int, step: int = 256) -> dict[str, int | None]:
    """Each side's longest completion within ``budget`` (multiples of ``step``): memory capacity, searched past the
    model's context up to :data:`TOP` tokens (the published lengths compared with are capacities too; a trace at a
    million tokens runs the head's chunk loop tens of thousands of times)."""
    from slimrl.planning.compare import _longest, trl_side
    from slimrl.planning.plan import plan
    from slimrl.planning.verdict import fitting_bytes

    ours = plan(config, s, search=False)
    tokens = s.max_prompt_length + s.max_completion_length
    gen_per_token = ours.phases.get("generation", 0) / tokens
    budget = fitting_bytes(budget, "cuda")  # the longest whose verdict is "fits"
    out = {
        name: _longest(
            lambda c, t=t: plan(config, replace(s, max_completion_length=c, tiled_mlp=t), search=False).peak_bytes,
            budget,
            step,
            TOP,
        )
        for name, t in (("slimrl", None), ("slimrl untiled", False))
    }
    trl_s = replace(s, gradient_checkpointing="true")
    for name, family in (("trl 1.16", "fused_head"), ("trl + liger", "liger")):
        out[name] = _longest(
            lambda c, family=family: trl_side(
                config, replace(trl_s, max_completion_length=c), family, int(gen_per_token * (s.max_prompt_length + c))
            )["peak_bytes"],
            budget,
            step,
            TOP,
        )
    return out


def gemma_rows(trainers: tuple[str, ...] | None = None) -> list[dict]:
    """The validation table's gemma-3-1b configurations (full fine-tuning, bf16, batch size 1, KTO 2) for slimrl: its
    plan at 8,192 tokens and its longest length (under the validation's likely share of the 79 GiB less the CUDA
    context), beside TRL 1.16 alone's simulation (``trainers``: a
    subset of the table's, all by default). The reference model as the validation assumes it (TRL's defaults: DPO,
    KTO, RLOO's ``beta=0.05``)."""
    from gpu_predict import CAPACITY, PUBLISHED, gemma3_1b, longest

    from slimrl.compat.gpus import CUDA_CONTEXT_BYTES
    from slimrl.patching.table import PLANNED
    from slimrl.planning.baseline import simulate
    from slimrl.planning.plan import plan
    from slimrl.planning.settings import Settings
    from slimrl.planning.verdict import LIKELY

    config, rows, likely = gemma3_1b(), [], int(LIKELY * (CAPACITY - CUDA_CONTEXT_BYTES))
    for trainer, (batch, _) in PUBLISHED.items():
        if trainers and trainer not in trainers:
            continue

        def ours(tokens: int, trainer=trainer, batch=batch) -> int:
            s = Settings(
                algorithm=trainer,
                workload=PLANNED[trainer],
                per_device_train_batch_size=batch,
                num_generations=1,
                max_prompt_length=1,
                max_completion_length=tokens - 1,
                lora_r=0,
                device="cuda",
                gradient_checkpointing="slimrl",
                beta=0.05 if PLANNED[trainer].trl.default_reference else 0.0,
            )
            return plan(config, s, search=False).peak_bytes

        def theirs(tokens: int, trainer=trainer, batch=batch) -> int:
            return simulate(config, PLANNED[trainer], tokens, "fused_head", rows=batch).peak_bytes

        row = {
            "row": f"gemma-3-1b {trainer} (full fine-tuning{', batch 2' if batch == 2 else ''})",
            "slimrl_8192": round(ours(8192) / GIB, 2),
            "trl 1.16_8192": round(theirs(8192) / GIB, 2),
            "slimrl_longest": longest(ours, likely),
            "trl 1.16_longest": longest(theirs, likely),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def predict() -> list[dict]:
    from slimrl.planning.search import largest_phase

    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, shape, extra in ROWS:
            config, s = config_of(shape), settings_of(extra)
            got = sides(config, s)
            row = {
                "row": label,
                **{k: round(v["peak_bytes"] / GIB, 2) for k, v in got.items()},
                "largest_slimrl_phase": largest_phase(got["slimrl"]["phases"]),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
            if shape == "qwen2.5-1.5b":
                for budget in (24, 80):
                    fit = {"row": f"{label}: longest completion in {budget} GB", **longest(config, s, budget * 10**9)}
                    rows.append(fit)
                    print(json.dumps(fit), flush=True)
        rows += gemma_rows()
    return rows
