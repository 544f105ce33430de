"""One small training run per trainer and loss type, built the same way for TRL alone and for TRL + slimrl.

Each scenario builds a fresh trainer (the patch state is set by the caller first, so construction-time hooks run
as a user's would) on a tiny model: two optimizer steps of plain SGD (an update is then proportional to its
(clipped) gradient; Adam would hide gradient errors), a moderate constant learning rate with TRL's gradient clipping
(so step two is not a chaotic amplifier of rounding differences), fixed seeds. Online
trainers (GRPO, RLOO, OnlineDPO, XPO) train a LoRA adapter whose A and B are both random, so both get gradient on
step one and the reference is the adapter switched off; offline trainers train every weight against an explicit
reference copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

PROMPTS = ["1+2=", "what is 3+4?", "5+6=", "7+8="]
PAIRS = [
    {"prompt": "1+2=", "chosen": "3.", "rejected": "12 or 4."},
    {"prompt": "what is 3+4?", "chosen": "7", "rejected": "34"},
    {"prompt": "5+6=", "chosen": "11, easy.", "rejected": "56"},
    {"prompt": "7+8=", "chosen": "15", "rejected": "it is 78?"},
]
# extra config values some loss types need to be well defined
LOSS_EXTRAS = {("dpo", "robust"): {"label_smoothing": 0.1}, ("dpo", "exo_pair"): {"label_smoothing": 1e-3},
               ("grpo", "luspo"): {"importance_sampling_level": "sequence"}}
NOT_VERIFIED = {  # trainer -> why it has no row (said under the table)
    "ppo": "TRL 1.12's PPO needs a value and a reward model and slimrl leaves its loop to TRL",
    "prm": "slimrl adds only checks to PRM (a 2-class head)",
}


@dataclass
class Setup:
    """What every scenario is built from."""

    config: Any  # the (tiny) model config
    tokenizer: Any
    device: str
    dtype: torch.dtype
    quantized: str | None = None  # "4bit" / "8bit": the trained model's base is quantized (LoRA scenarios only)
    generator: str = "hf"  # GRPO/RLOO generate with: "hf" (generate), "engine" (slimrl's vLLM engine), "server"
    weights: str | None = None  # engine/server: the model directory the trained model (and the generator) load
    server_url: str | None = None  # server: the vLLM server's base URL
    overrides: dict = field(default_factory=dict)  # config values set over every scenario's own


def digits_reward(completions, **kwargs) -> list[float]:
    """How many digits a completion has, minus a length term (a signal a random model's samples vary in)."""
    return [float(sum(ch.isdigit() for ch in c)) - 0.05 * len(c) for c in completions]


def _common(out_dir: str, setup: Setup) -> dict:
    common = dict(output_dir=out_dir, max_steps=2, learning_rate=0.1, optim="sgd", lr_scheduler_type="constant",
                  max_grad_norm=1.0, report_to="none", use_cpu=setup.device == "cpu",
                  bf16=setup.dtype == torch.bfloat16, save_strategy="no", logging_steps=1, seed=7,
                  gradient_checkpointing=False, disable_tqdm=True)
    if setup.generator == "server":
        common.update(use_vllm=True, vllm_mode="server", vllm_server_base_url=setup.server_url)
    return common


def _loaded(setup: Setup):
    """The engine/server scenarios' model: ``setup.weights`` loaded by ``FastLanguageModel`` (with its colocated
    engine for "engine"; the engine then becomes the trainer's generator)."""
    from slimrl import FastLanguageModel

    model, _ = FastLanguageModel.from_pretrained(setup.weights, dtype=setup.dtype, max_seq_length=256,
                                                 fast_inference=setup.generator == "engine", max_lora_rank=8,
                                                 gpu_memory_utilization="auto")
    return model


def _model(setup: Setup, seed: int = 0, lora: bool = False, kind: str = "causal"):
    from slimrl.verify.tiny import build

    if lora and setup.generator != "hf":
        model = _loaded(setup)
    else:
        model = build(setup.config, seed, kind=kind, dtype=setup.dtype,
                      quantized=setup.quantized if lora else None, device=setup.device)
    if lora:
        from peft import LoraConfig, get_peft_model

        from slimrl.models.fast_language_model import default_target_modules

        torch.manual_seed(1)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=default_target_modules(model),
                                                 init_lora_weights=False, task_type="CAUSAL_LM"))
    return model


def _dataset(rows: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(rows)


def _config(config_cls: type, out_dir: str, setup: Setup, **kwargs):
    return config_cls(**{**_common(out_dir, setup), **kwargs, **setup.overrides})


def grpo(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=4, num_generations=4,
                   max_completion_length=8, num_iterations=2, beta=0.04, temperature=0.9, loss_type=loss_type,
                   disable_dropout=True, **LOSS_EXTRAS.get(("grpo", loss_type), {}))
    return trainer_cls(model=_model(setup, lora=True), args=args, reward_funcs=[digits_reward],
                       train_dataset=_dataset([{"prompt": p} for p in PROMPTS]), processing_class=setup.tokenizer)


def rloo(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=4, num_generations=4,
                   max_completion_length=8, num_iterations=2, beta=0.05, temperature=0.9)
    return trainer_cls(model=_model(setup, lora=True), args=args, reward_funcs=[digits_reward],
                       train_dataset=_dataset([{"prompt": p} for p in PROMPTS]), processing_class=setup.tokenizer)


def dpo(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    field = config_cls.__dataclass_fields__["loss_type"]
    value = [loss_type] if "list" in str(field.type) else loss_type
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=4, loss_type=value,
                   **LOSS_EXTRAS.get(("dpo", loss_type), {}))
    return trainer_cls(model=_model(setup), ref_model=_model(setup), args=args, train_dataset=_dataset(PAIRS),
                       processing_class=setup.tokenizer)


def _unpaired() -> list[dict]:
    return [{"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"} for r in PAIRS
            for k in ("chosen", "rejected")]


def kto(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=8, loss_type=loss_type)
    return trainer_cls(model=_model(setup), ref_model=_model(setup), args=args, train_dataset=_dataset(_unpaired()),
                       processing_class=setup.tokenizer)


def bco(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=8, max_length=64)
    return trainer_cls(model=_model(setup), ref_model=_model(setup), args=args, train_dataset=_dataset(_unpaired()),
                       processing_class=setup.tokenizer)


def sft(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=4, loss_type=loss_type)
    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in PAIRS]
    return trainer_cls(model=_model(setup), args=args, train_dataset=_dataset(rows), processing_class=setup.tokenizer)


def orpo(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=4, max_length=64, beta=0.2)
    return trainer_cls(model=_model(setup), args=args, train_dataset=_dataset(PAIRS), processing_class=setup.tokenizer)


def cpo(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=4, max_length=64, loss_type=loss_type,
                   cpo_alpha=0.5)
    return trainer_cls(model=_model(setup), args=args, train_dataset=_dataset(PAIRS), processing_class=setup.tokenizer)


def online_dpo(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=2, max_new_tokens=8, max_length=64,
                   loss_type=loss_type)
    return trainer_cls(model=_model(setup, lora=True), reward_funcs=[digits_reward], args=args,
                       train_dataset=_dataset([{"prompt": p} for p in PROMPTS]), processing_class=setup.tokenizer)


def xpo(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=2, max_new_tokens=8, max_length=64)
    return trainer_cls(model=_model(setup, lora=True), reward_funcs=_model(setup, seed=5, kind="scorer"),
                       args=args, train_dataset=_dataset([{"prompt": p} for p in PROMPTS]),
                       processing_class=setup.tokenizer, reward_processing_classes=setup.tokenizer)


def reward(trainer_cls, config_cls, out_dir, setup: Setup, loss_type: str):
    args = _config(config_cls, out_dir, setup, per_device_train_batch_size=4)
    rows = [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]} for r in PAIRS]
    return trainer_cls(model=_model(setup, kind="scorer"), args=args, train_dataset=_dataset(rows),
                       processing_class=setup.tokenizer)


# Scenarios that train a LoRA adapter on the model (the only ones a quantized base can run).
LORA_SCENARIOS = ("grpo", "rloo", "online_dpo", "xpo")
BUILDERS: dict[str, Callable] = {"grpo": grpo, "rloo": rloo, "dpo": dpo, "kto": kto, "sft": sft, "orpo": orpo,
                                 "cpo": cpo, "online_dpo": online_dpo, "reward": reward, "bco": bco, "xpo": xpo}


def loss_types(name: str, config_cls: type) -> list[str]:
    """The loss types the installed config offers for ``name`` (``["default"]`` where it has one loss).
    ``chunked_nll`` (SFT) is TRL's own non-fused path, left out."""
    from slimrl.compat.trl_info import config_choices, grpo_loss_types

    if name == "grpo":
        return grpo_loss_types()
    if name in ("dpo", "kto", "sft", "cpo", "online_dpo") and "loss_type" in config_cls.__dataclass_fields__:
        return list(dict.fromkeys(t for t in config_choices(config_cls) if t != "chunked_nll")) or ["default"]
    return ["default"]
