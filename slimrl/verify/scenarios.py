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
    slimrl_fields: dict = field(default_factory=dict)  # slimrl's config fields, set where the config has them (patched)


def digits_reward(completions, **kwargs) -> list[float]:
    """How many digits a completion has, minus a length term (a signal a random model's samples vary in)."""
    return [float(sum(ch.isdigit() for ch in c)) - 0.05 * len(c) for c in completions]


def _common(out_dir: str, setup: Setup) -> dict:
    common = dict(
        output_dir=out_dir,
        max_steps=2,
        learning_rate=0.1,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        report_to="none",
        use_cpu=setup.device == "cpu",
        bf16=setup.dtype == torch.bfloat16,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    if setup.generator == "server":
        common.update(use_vllm=True, vllm_mode="server", vllm_server_base_url=setup.server_url)
    return common


def _loaded(setup: Setup):
    """The engine/server scenarios' model: ``setup.weights`` loaded by ``FastLanguageModel`` (with its colocated
    engine for "engine"; the engine then becomes the trainer's generator)."""
    from slimrl.models import FastLanguageModel

    model, _ = FastLanguageModel.from_pretrained(
        setup.weights,
        dtype=setup.dtype,
        max_seq_length=256,
        fast_inference=setup.generator == "engine",
        max_lora_rank=8,
        gpu_memory_utilization="auto",
    )
    return model


def _model(setup: Setup, seed: int = 0, lora: bool = False, kind: str = "causal"):
    from slimrl.verify.tiny import build

    if lora and setup.generator != "hf":
        model = _loaded(setup)
    else:
        model = build(
            setup.config,
            seed,
            kind=kind,
            dtype=setup.dtype,
            quantized=setup.quantized if lora else None,
            device=setup.device,
        )
    if lora:
        from peft import LoraConfig, get_peft_model

        from slimrl.models.fast_language_model import default_target_modules

        torch.manual_seed(1)
        model = get_peft_model(
            model,
            LoraConfig(
                r=4,
                lora_alpha=8,
                target_modules=default_target_modules(model),
                init_lora_weights=False,
                task_type="CAUSAL_LM",
            ),
        )
    return model


def _dataset(rows: list[dict]):
    from datasets import Dataset

    return Dataset.from_list(rows)


class Kit:
    """What a trainer's verify scenario (``scenario(kit, loss_type)`` in its module under
    ``slimrl/patching/trainers/``) builds its run from: the setup's models, the small datasets, a reward, the config
    every scenario shares, and the trainer class of the installed TRL (patched or not, as the caller set it)."""

    PROMPTS, PAIRS = PROMPTS, PAIRS

    def __init__(self, trainer_cls: type, config_cls: type, out_dir: str, setup: Setup):
        self.trainer_cls, self.config_cls, self.out_dir, self.setup = trainer_cls, config_cls, out_dir, setup
        self.tokenizer = setup.tokenizer
        self.digits_reward = digits_reward

    def config(self, **kwargs):
        """The config class with the shared settings (module docstring), ``kwargs`` and the setup's overrides (its
        ``slimrl_fields`` only on a patched run's config, the one that declares them)."""
        declared = getattr(self.config_cls, "__dataclass_fields__", {})
        ours = {k: v for k, v in self.setup.slimrl_fields.items() if k in declared}
        return self.config_cls(**{**_common(self.out_dir, self.setup), **kwargs, **self.setup.overrides, **ours})

    def config_is_list(self, field: str) -> bool:
        """Whether the installed config declares ``field`` as a list (DPO's ``loss_type`` from TRL 1.13)."""
        return "list" in str(self.config_cls.__dataclass_fields__[field].type)

    def model(self, seed: int = 0, lora: bool = False, kind: str = "causal"):
        """A tiny model of the setup's config (``kind``: "causal" or "scorer"), with a LoRA adapter whose A and B
        are both random when ``lora``. Only LoRA scenarios can run on a quantized base (:class:`UnquantizableError`)."""
        if self.setup.quantized and not lora and kind == "causal":
            raise UnquantizableError("it trains every weight, which a quantized base cannot")
        return _model(self.setup, seed, lora, kind)

    def dataset(self, rows: list[dict]):
        from datasets import Dataset

        return Dataset.from_list(rows)

    def prompts(self):
        return self.dataset([{"prompt": p} for p in PROMPTS])

    def pairs(self):
        return self.dataset(PAIRS)

    def unpaired(self):
        """The pairs as KTO/BCO rows: (prompt, completion, label)."""
        return self.dataset(
            [
                {"prompt": r["prompt"], "completion": r[k], "label": k == "chosen"}
                for r in PAIRS
                for k in ("chosen", "rejected")
            ]
        )

    def trainer(self, **kwargs):
        """The trainer class built with the setup's tokenizer and ``kwargs``."""
        return self.trainer_cls(processing_class=self.tokenizer, **kwargs)


class UnquantizableError(ValueError):
    """The scenario cannot run on a quantized base (why in the message)."""


def loss_types(name: str, config_cls: type) -> list[str]:
    """The loss types the installed config offers for ``name`` (``["default"]`` where it has one loss).
    ``chunked_nll`` (SFT) is TRL's own non-fused path, left out."""
    from slimrl.compat.trl_info import config_choices, grpo_loss_types
    from slimrl.patching.table import every_trainer

    kind = every_trainer()[name].about.loss_types  # the trainer's row in the table says which
    if kind == "grpo":  # and the agentic rows the installed TRL can run (slimrl.verify.agentic)
        from slimrl.verify.agentic import available

        return grpo_loss_types() + available()
    if kind == "config" and "loss_type" in config_cls.__dataclass_fields__:
        return list(dict.fromkeys(t for t in config_choices(config_cls) if t != "chunked_nll")) or ["default"]
    return ["default"]
