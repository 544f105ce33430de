"""SFT's ``max_length`` from ``from_pretrained(max_seq_length=...)`` where the user set none (Unsloth's rule,
slimrl/patching/every_trainer/model_lengths.py); a value the user gave is kept, and TRL alone keeps TRL's default."""

from __future__ import annotations

import pytest

from slimrl import FastLanguageModel, PatchFastRL, unpatch
from tests.tiny import tiny_llama, tiny_tokenizer

LONG = 2300  # characters = tokens of the tiny character tokenizer: longer than TRL's default max_length (1,024)


def _sft(tmp_path, **config):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    path = tmp_path / "m"
    tiny_llama(max_position_embeddings=4096).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    model, tok = FastLanguageModel.from_pretrained(str(path), max_seq_length=4096)
    row = "1+2=3 " * (LONG // 6) + "9" * (LONG % 6)
    args = SFTConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=1,
        max_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        dataset_text_field="text",
        **config,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list([{"text": row}]), processing_class=tok)
    return trainer


def test_sft_trains_a_long_row_whole_from_the_models_max_seq_length(tmp_path, capsys):
    PatchFastRL("sft")
    try:
        trainer = _sft(tmp_path)
        out = capsys.readouterr().out
        trainer.train()
    finally:
        unpatch()
    assert trainer.args.max_length == 4096
    assert len(trainer.train_dataset[0]["input_ids"]) >= LONG  # not cut at TRL's 1,024
    assert "max_length" in out and "1024 -> 4096" in out and "max_seq_length" in out  # the changed-settings row


@pytest.mark.parametrize("given", [512, None])
def test_a_max_length_the_user_gave_is_kept(tmp_path, given):
    PatchFastRL("sft")
    try:
        trainer = _sft(tmp_path, max_length=given)
    finally:
        unpatch()
    assert trainer.args.max_length == given


def test_trl_alone_keeps_its_default(tmp_path):
    unpatch()
    trainer = _sft(tmp_path)
    assert trainer.args.max_length == 1024
    assert len(trainer.train_dataset[0]["input_ids"]) == 1024
