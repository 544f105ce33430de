"""Defaults slimrl changes only when the user did not set them, announced once in a table."""

from __future__ import annotations

import pytest
import torch

from slimrl import PatchFastRL, unpatch
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture(autouse=True)
def patched():
    PatchFastRL()
    yield
    unpatch()


def _grpo(tmp_path, model, **cfg):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, use_cpu=True,
                        max_steps=1, report_to="none", **cfg)
    return GRPOTrainer(model=model, args=config, reward_funcs=[lambda completions, **k: [1.0] * len(completions)],
                       train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 2), processing_class=tiny_tokenizer())


def test_unset_defaults_are_tuned_and_printed_once(tmp_path, capsys):
    trainer = _grpo(tmp_path, tiny_llama())
    out = capsys.readouterr().out
    assert "slimrl: defaults changed (pass them to GRPOConfig to keep TRL's):" in out
    assert "logging_steps  10 -> 1" in out and "bf16           True -> False (model is float32)" in out
    assert trainer.args.logging_steps == 1 and trainer.args.bf16 is False
    assert trainer.accelerator.mixed_precision == "no", "the fp32 model must train without bf16 autocast"
    from slimrl.patching.defaults import print_changed_defaults

    print_changed_defaults(trainer.args)
    assert capsys.readouterr().out == "", "the table is printed once per config"


def test_explicit_values_are_kept_and_not_listed(tmp_path, capsys):
    trainer = _grpo(tmp_path, tiny_llama(), logging_steps=5, bf16=True)
    assert trainer.args.logging_steps == 5 and trainer.args.bf16 is True
    assert "defaults changed" not in capsys.readouterr().out


def test_fp16_model_without_precision_flags_trains_without_bf16(tmp_path):
    trainer = _grpo(tmp_path, tiny_llama().to(torch.float16))
    assert trainer.args.bf16 is False and trainer.args.fp16 is torch.cuda.is_available()


def test_other_trainers_get_the_same_defaults(tmp_path, capsys):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    pairs = [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}] * 2
    trainer = DPOTrainer(model=tiny_llama(), ref_model=tiny_llama(), train_dataset=Dataset.from_list(pairs),
                         processing_class=tiny_tokenizer(), args=DPOConfig(output_dir=str(tmp_path), use_cpu=True,
                                                                           report_to="none"))
    assert trainer.args.logging_steps == 1 and trainer.args.bf16 is False
    assert "pass them to DPOConfig to keep TRL's" in capsys.readouterr().out
