"""Older keywords in common scripts keep working after PatchFastRL, each with a one-line FutureWarning.

The DPO and PPO snippets are the shapes Unsloth notebooks and TRL 0.12-era examples use, with only the model
swapped for a tiny local one; each trains a step to show the translated call is a working call.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from slimrl import FastLanguageModel, PatchFastRL, unpatch
from slimrl.patching import trainer_available
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer

CPU = CPU_ARGS
PAIRS = [
    {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a * b + 1)}
    for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]
]


def _messages(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_unsloth_style_dpo_snippet_runs(tiny_model_dir, tmp_path):
    """Unsloth's DPO notebook passes beta / max_length / max_prompt_length and tokenizer= to the trainer."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    PatchFastRL("dpo", FastLanguageModel)
    try:
        model, tokenizer = FastLanguageModel.from_pretrained(
            str(tiny_model_dir), max_seq_length=128, load_in_4bit=False
        )
        model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=4, use_gradient_checkpointing=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dpo_trainer = DPOTrainer(
                model=model,
                ref_model=None,
                args=DPOConfig(
                    per_device_train_batch_size=2,
                    gradient_accumulation_steps=1,
                    max_steps=1,
                    learning_rate=5e-6,
                    logging_steps=1,
                    output_dir=str(tmp_path / "out"),
                    seed=42,
                    gradient_checkpointing=False,
                    **CPU,
                ),
                beta=0.1,
                train_dataset=Dataset.from_list(PAIRS),
                tokenizer=tokenizer,
                max_length=64,
                max_prompt_length=32,
            )
        messages = _messages(caught)
        assert any("tokenizer=" in m and "processing_class=" in m for m in messages), messages
        assert any("beta=" in m and "max_length=" in m and "DPOConfig" in m for m in messages), messages
        assert any("max_prompt_length=" in m and "ignored" in m for m in messages), messages
        assert all("\n" not in m for m in messages), "each deprecation warning is one line"
        assert dpo_trainer.args.beta == 0.1 and dpo_trainer.args.max_length == 64
        dpo_trainer.train()
        assert dpo_trainer.state.global_step == 1
    finally:
        unpatch()


def test_max_new_tokens_and_tokenizer_for_grpo(tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    PatchFastRL("grpo")
    try:
        with pytest.warns(FutureWarning, match=r"max_new_tokens=.*max_completion_length="):
            config = GRPOConfig(
                output_dir=str(tmp_path),
                max_new_tokens=6,
                per_device_train_batch_size=2,
                num_generations=2,
                max_steps=1,
                gradient_checkpointing=False,
                **CPU,
            )
        assert config.max_completion_length == 6
        with pytest.raises(TypeError, match="pass max_completion_length= only"):
            GRPOConfig(output_dir=str(tmp_path), max_new_tokens=6, max_completion_length=6, **CPU)
        with pytest.warns(FutureWarning, match=r"GRPOTrainer\(tokenizer=...\) is deprecated"):
            trainer = GRPOTrainer(
                model=tiny_llama(),
                args=config,
                reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                train_dataset=Dataset.from_list([{"prompt": "1+2="}] * 2),
                tokenizer=tiny_tokenizer(),
            )
        assert trainer.processing_class is not None
        with pytest.raises(TypeError, match="got both tokenizer= and processing_class="):
            GRPOTrainer(
                model=tiny_llama(),
                args=config,
                reward_funcs=[lambda **kw: []],
                train_dataset=[],
                tokenizer=tiny_tokenizer(),
                processing_class=tiny_tokenizer(),
            )
    finally:
        unpatch()
    # without slimrl the old spelling is TRL's own TypeError again: the translation lives only in the patch
    with pytest.raises(TypeError):
        GRPOConfig(output_dir=str(tmp_path), max_new_tokens=6, **CPU)


def test_unknown_keyword_still_fails_as_in_trl(tmp_path):
    from trl import DPOConfig, DPOTrainer

    PatchFastRL("dpo")
    try:
        with pytest.raises(TypeError, match="not_a_dpo_option"):
            DPOTrainer(model=tiny_llama(), args=DPOConfig(output_dir=str(tmp_path), **CPU), not_a_dpo_option=1)
    finally:
        unpatch()


@pytest.mark.skipif(not trainer_available("ppo"), reason="this TRL has no PPOTrainer (last in 1.12.0)")
def test_trl012_style_ppo_snippet_runs(tmp_path):
    """TRL 0.12-era PPO script: config=, processing_class/tokenizer=, policy=, ref_policy= ..."""
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForSequenceClassification

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl.experimental.ppo import PPOConfig, PPOTrainer

    def score_model(seed):
        torch.manual_seed(seed)
        return LlamaForSequenceClassification(
            LlamaConfig(
                vocab_size=49,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=2,
                num_labels=1,
                pad_token_id=0,
            )
        )

    tok = tiny_tokenizer()
    ds = Dataset.from_list([{"input_ids": tok(p["prompt"])["input_ids"]} for p in PAIRS])
    PatchFastRL("ppo")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = PPOTrainer(
                config=PPOConfig(
                    output_dir=str(tmp_path),
                    per_device_train_batch_size=2,
                    num_mini_batches=1,
                    total_episodes=4,
                    response_length=6,
                    num_ppo_epochs=1,
                    missing_eos_penalty=1.0,
                    **CPU,
                ),
                tokenizer=tok,
                policy=tiny_llama(seed=0),
                ref_policy=tiny_llama(seed=0),
                reward_model=score_model(1),
                value_model=score_model(2),
                train_dataset=ds,
            )
        messages = _messages(caught)
        for old, new in [
            ("config=", "args="),
            ("tokenizer=", "processing_class="),
            ("policy=", "model="),
            ("ref_policy=", "ref_model="),
        ]:
            assert any(f"({old}...)" in m and new in m for m in messages), (old, messages)
        trainer.train()
        assert trainer.state.episode >= 4
    finally:
        unpatch()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-accelerator case")
def test_gpu_style_snippets_train_on_this_cpu(tiny_model_dir, tmp_path):
    """Unsloth-style GRPO and DPO scripts, exactly as written for a GPU (no precision flag, no use_cpu,
    ``tokenizer=``, ``max_new_tokens=``), train here with slimrl patched."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer

    PatchFastRL("grpo", FastLanguageModel)
    PatchFastRL("dpo", FastLanguageModel)
    try:
        model, tokenizer = FastLanguageModel.from_pretrained(str(tiny_model_dir), max_seq_length=128)
        model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = GRPOConfig(
                output_dir=str(tmp_path / "grpo"),
                per_device_train_batch_size=1,
                num_generations=8,
                max_new_tokens=32,
                max_steps=1,
                report_to="none",
            )
            trainer = GRPOTrainer(
                model=model,
                args=args,
                tokenizer=tokenizer,
                reward_funcs=[lambda completions, **kw: [float(len(c)) for c in completions]],
                train_dataset=Dataset.from_list([{"prompt": f"{a}+1="} for a in range(8)]),
            )
        trainer.train()
        assert trainer.state.global_step == 1 and args.bf16 is False

        model, tokenizer = FastLanguageModel.from_pretrained(str(tiny_model_dir), max_seq_length=128)
        model = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=4)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpo = DPOTrainer(
                model=model,
                ref_model=None,
                tokenizer=tokenizer,
                train_dataset=Dataset.from_list(PAIRS),
                args=DPOConfig(
                    output_dir=str(tmp_path / "dpo"),
                    beta=0.1,
                    max_steps=1,
                    per_device_train_batch_size=2,
                    report_to="none",
                ),
            )
        dpo.train()
        assert dpo.state.global_step == 1
    finally:
        unpatch()
