"""Auto-fit (slimrl/patching/online/autofit.py): ``slimrl_auto_fit=True`` applies the fastest plan that fits the budget
before the trainer is built, says so in the changed-defaults table, and refuses a budget nothing fits."""

from __future__ import annotations

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from slimrl.patching.every_trainer.state import config_state
from slimrl.planning import Settings, plan
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer

# Wide enough that activations matter: 4 layers, hidden 256, 4 x (prompt + 448) tokens.
WIDE = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, max_position_embeddings=1024)


def _trainer(tmp_path, model, **cfg):
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from trl import GRPOConfig, GRPOTrainer

    model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    )
    args = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_steps=1,
        learning_rate=1e-3,
        logging_steps=1,
        seed=0,
        **CPU_ARGS,
    )
    args.update(cfg)
    ds = Dataset.from_list([{"prompt": p} for p in ["1+2=", "3+4=", "5+6=", "7+8="]])
    return GRPOTrainer(
        model=model,
        args=GRPOConfig(**args),
        reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
        train_dataset=ds,
        processing_class=tiny_tokenizer(),
    )


@pytest.fixture
def grpo():
    unpatch()
    PatchFastRL("grpo")
    yield
    unpatch()


def test_roomy_budget_turns_checkpointing_off_and_trains(grpo, tmp_path, capsys):
    """TRL's default checkpointing (on) recomputes every layer; with room to spare auto-fit turns it off, prints
    it, and the run trains."""
    trainer = _trainer(
        tmp_path, tiny_llama(), max_completion_length=8, slimrl_auto_fit=True, slimrl_memory_budget="64GB"
    )
    out = capsys.readouterr().out
    assert "gradient_checkpointing" in out and "auto_fit: plan" in out and "of 64.00 GiB" in out
    assert trainer.args.gradient_checkpointing is False
    assert trainer.args.unsloth_grpo_mini_batch is None
    trainer.train()
    assert not trainer.model.get_base_model().is_gradient_checkpointing
    assert trainer.state.global_step == 1


def test_budget_between_the_plans_keeps_checkpointing(grpo, tmp_path):
    """A budget above the all-layers plan but below the no-checkpointing plan: some checkpointing stays on."""
    from transformers import LlamaConfig

    config = LlamaConfig(vocab_size=49, num_attention_heads=4, num_key_value_heads=2, **WIDE)
    common = dict(
        per_device_train_batch_size=4,
        num_generations=4,
        max_prompt_length=4,
        max_completion_length=448,
        lora_r=4,
        beta=0.0,
    )
    off = plan(config, Settings(gradient_checkpointing="false", **common)).peak_bytes
    every = plan(config, Settings(gradient_checkpointing="slimrl", **common)).peak_bytes
    assert off - every > 20 * 2**20, "the test needs plans far enough apart"
    budget = (off + every) // 2
    trainer = _trainer(
        tmp_path,
        tiny_llama(**WIDE),
        max_completion_length=448,
        beta=0.0,
        slimrl_auto_fit=True,
        slimrl_memory_budget=f"{budget / 2**20:.0f}MB",
    )
    assert trainer.args.gradient_checkpointing is True
    assert trainer.model.get_base_model().is_gradient_checkpointing
    assert config_state(trainer.args).auto_fit_plan.peak_bytes <= budget
    assert "gradient_checkpointing" in config_state(trainer.args).changed


def test_budget_below_the_weights_is_refused_before_training(grpo, tmp_path):
    with pytest.raises(ValueError, match=r"slimrl_memory_budget=1MB: below the weights and runtime"):
        _trainer(tmp_path, tiny_llama(), max_completion_length=8, slimrl_auto_fit=True, slimrl_memory_budget="1MB")


def test_bad_budget_text_is_refused_at_config(grpo, tmp_path):
    from trl import GRPOConfig

    with pytest.raises(ValueError, match="slimrl_memory_budget='lots' is invalid"):
        GRPOConfig(output_dir=str(tmp_path), slimrl_memory_budget="lots", **CPU_ARGS)


def test_auto_fit_off_changes_nothing(grpo, tmp_path):
    trainer = _trainer(tmp_path, tiny_llama(), max_completion_length=8)
    assert trainer.args.gradient_checkpointing is True  # TRL's default
    assert "gradient_checkpointing" not in config_state(trainer.args).changed
    assert torch.is_grad_enabled()


def test_cli_flags():
    from slimrl.cli.args import parse

    _, cfg = parse(["--auto_fit", "true", "--memory_budget", "12GB", "--longest_first", "true"])
    assert cfg.slimrl_auto_fit is True and cfg.slimrl_memory_budget == "12GB" and cfg.slimrl_longest_first is True
