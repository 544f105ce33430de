"""Hybrid-attention models (LFM2: short convolutions; Qwen3.5 text: Gated-DeltaNet) keep linear-attention layers in
their cache, whose states the shared prefill cannot expand row by row: it stands aside (one line naming the layers,
decided from the cache transformers builds for the config) and GRPO trains under slimrl's defaults, equal to TRL
alone (tolerance 1e-4, the GRPO parity tests')."""

from __future__ import annotations

import logging

import pytest
import torch

from slimrl.generation.shared_prefill import why_not
from tests.patching.parity import assert_patched_equals_unpatched
from tests.tiny import HYBRID, tiny_hybrid, tiny_llama, tiny_tokenizer


def _run(out, model_type: str):
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from trl import GRPOConfig, GRPOTrainer

    from slimrl.models.targets import default_target_modules

    model = tiny_hybrid(model_type)
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
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    seen = []

    def reward(completions, **kwargs):
        seen.append(list(completions))
        return [float(sum(ch.isdigit() for ch in c)) for c in completions]

    cfg = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=0.5,
        optim="sgd",
        lr_scheduler_type="constant",
        temperature=0.9,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        logging_steps=1,
        seed=7,
        gradient_checkpointing=False,
        disable_dropout=True,
    )
    trainer = GRPOTrainer(
        model=model,
        args=cfg,
        reward_funcs=[reward],
        processing_class=tiny_tokenizer(),
        train_dataset=Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4="]]),
    )
    trainer.train()
    deltas = {n: p.detach() - before[n] for n, p in model.named_parameters() if p.requires_grad}
    return seen, deltas, [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer


@pytest.mark.parametrize("model_type", sorted(HYBRID))
def test_grpo_on_a_hybrid_model_equals_trl(tmp_path, caplog, monkeypatch, model_type):
    from slimrl.generation import shared_prefill

    monkeypatch.setattr(shared_prefill, "_SAID", set())  # said once per process: here, once per test
    caplog.set_level(logging.INFO, logger="slimrl")
    assert_patched_equals_unpatched(lambda out: _run(out, model_type), "grpo", tmp_path)
    assert "LinearAttentionLayer layers keep states" in caplog.text


def test_the_reason_is_read_from_the_cache_layers():
    ids = torch.tensor([[3, 4, 5], [3, 4, 5]])
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for model_type in HYBRID:
        model = tiny_hybrid(model_type).eval()
        assert "LinearAttentionLayer" in why_not(model, (), kwargs)
    assert why_not(tiny_llama().eval(), (), kwargs) is None
