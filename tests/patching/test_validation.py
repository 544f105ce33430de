"""The patched GRPOTrainer refuses sequences longer than the model's max_seq_length, with a clear message."""

from __future__ import annotations

import pytest

from slimrl import FastLanguageModel, PatchFastRL, unpatch
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture
def patched():
    PatchFastRL("grpo")
    yield
    unpatch()


def _trainer(tmp_path, max_seq_length, prompt, completion_len):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tiny_llama().save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    model, tok = FastLanguageModel.from_pretrained(str(tmp_path / "m"), max_seq_length=max_seq_length)
    model = FastLanguageModel.get_peft_model(model, r=2)
    cfg = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                     max_completion_length=completion_len, max_steps=1, report_to="none", use_cpu=True, bf16=False,
                     save_strategy="no")
    return GRPOTrainer(model=model, args=cfg, reward_funcs=[lambda completions, **k: [1.0] * len(completions)],
                       train_dataset=Dataset.from_list([{"prompt": prompt}] * 2), processing_class=tok)


def test_completion_budget_over_max_seq_length(tmp_path, patched):
    with pytest.raises(ValueError, match=r"max_completion_length=32 leaves no room .* max_seq_length=32"):
        _trainer(tmp_path, 32, "1+1=", 32)


def test_long_prompt_fails_before_the_forward(tmp_path, patched):
    trainer = _trainer(tmp_path, 20, "1+1=" * 6, 8)  # 24 prompt tokens + 8 > 20
    with pytest.raises(ValueError, match=r"prompt \+ completion of \d+ tokens exceeds the model's max_seq_length=20"):
        trainer.train()
