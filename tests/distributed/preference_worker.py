"""One patched ORPO or CPO step (a LoRA adapter on the tiny Llama: its own LM head, frozen, which slimrl's
score-positions route projects itself) under ``accelerate launch`` with FSDP2, or in one process on the same global
batch (``--single``); ``--trl-alone``: without ``PatchFastRL``. Writes, per rank, the adapter after the step
(sharded DTensors gathered), whether the head was a sharded DTensor, and how many forwards slimrl's route served."""

from __future__ import annotations

import json
import sys
from pathlib import Path

PAIRS = [
    {"prompt": "1+2=", "chosen": "3.", "rejected": "12 or 4."},
    {"prompt": "what is 3+4?", "chosen": "7", "rejected": "34"},
    {"prompt": "5+6=", "chosen": "11, easy.", "rejected": "56"},
    {"prompt": "7+8=", "chosen": "15", "rejected": "it is 78?"},
]


def start_weights() -> dict:
    """The adapter every run starts from (the tiny Llama, seed 0, with the LoRA built below)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from tests.tiny import tiny_llama

    return {
        n: p.detach()
        for n, p in _with_adapter(tiny_llama(seed=0, tie=False), torch, LoraConfig, get_peft_model).named_parameters()
        if p.requires_grad
    }


def _with_adapter(model, torch, lora_config, get_peft_model):
    torch.manual_seed(1)
    return get_peft_model(
        model,
        lora_config(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM"
        ),
    )


def main(algorithm: str, out: str, single: bool = False, trl_alone: bool = False) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.distributed.grpo_worker import lift_accelerator_only_rule

    if not single:
        lift_accelerator_only_rule()
    import importlib
    import warnings

    import torch
    from accelerate import PartialState
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file

    from slimrl import PatchFastRL
    from slimrl.patching.routes import served
    from tests.tiny import tiny_llama, tiny_tokenizer

    if not trl_alone:
        PatchFastRL(algorithm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = importlib.import_module(f"trl.experimental.{algorithm}")
    trainer_cls = getattr(module, f"{algorithm.upper()}Trainer")
    config_cls = getattr(module, f"{algorithm.upper()}Config")
    state = PartialState()
    # an LM head of its own (FSDP2 shards it with the root unit), frozen under the adapter
    model = _with_adapter(tiny_llama(seed=0, tie=False), torch, LoraConfig, get_peft_model)
    extra = {"beta": 0.2} if algorithm == "orpo" else {"loss_type": "sigmoid", "cpo_alpha": 0.5}
    args = config_cls(
        output_dir=str(Path(out) / "run"),
        per_device_train_batch_size=4 if single else 2,
        max_length=64,
        max_steps=1,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        report_to="none",
        use_cpu=single,
        bf16=False,
        save_strategy="no",
        gradient_checkpointing=False,
        seed=7,
        **extra,
    )
    trainer = trainer_cls(
        model=model, args=args, train_dataset=Dataset.from_list(PAIRS), processing_class=tiny_tokenizer()
    )
    trainer.train()
    weights = {
        n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().contiguous()
        for n, p in model.named_parameters()
        if p.requires_grad
    }
    rank = "single" if single else state.process_index
    Path(out).mkdir(parents=True, exist_ok=True)
    save_file(weights, str(Path(out) / f"rank{rank}.safetensors"))
    Path(out, f"rank{rank}.json").write_text(
        json.dumps(
            {
                "world_size": state.num_processes,
                "engine": trainer.accelerator.distributed_type.value,
                "dtensor": any(hasattr(p, "full_tensor") for p in trainer.model_wrapped.parameters()),
                "head_dtensor": hasattr(model.get_output_embeddings().weight, "full_tensor"),
                "served": served(trainer),
                "loss": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], single="--single" in sys.argv[3:], trl_alone="--trl-alone" in sys.argv[3:])
