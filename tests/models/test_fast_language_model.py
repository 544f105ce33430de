"""FastLanguageModel: offline loading, LoRA through PEFT, errors that name the argument."""

from __future__ import annotations

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.models.fast_language_model import default_target_modules
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture
def tiny_dir(tmp_path):
    model, tok = tiny_llama(), tiny_tokenizer()
    tok.pad_token = None  # from_pretrained must set one
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_local_directory(tiny_dir):
    model, tok = FastLanguageModel.from_pretrained(str(tiny_dir), max_seq_length=128)
    assert model.max_seq_length == 128
    assert model.dtype == torch.float32  # CPU default
    assert tok.pad_token is not None
    ref = tiny_llama()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p, q), n


def test_dtype_argument(tiny_dir):
    model, _ = FastLanguageModel.from_pretrained(str(tiny_dir), dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16


def test_directory_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="without config.json"):
        FastLanguageModel.from_pretrained(str(tmp_path / "empty"))


def test_missing_gguf_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="gguf_file='nope.gguf' not found"):
        FastLanguageModel.from_pretrained(str(tmp_path), gguf_file="nope.gguf")


def test_4bit_without_bitsandbytes_warns_and_loads(tiny_dir, monkeypatch):
    from slimrl.models import fast_language_model

    monkeypatch.setattr(fast_language_model, "_bitsandbytes_works", lambda: False)
    with pytest.warns(UserWarning, match=r"load_in_4bit=True needs bitsandbytes .*loading .* unquantized"):
        model, _ = FastLanguageModel.from_pretrained(str(tiny_dir), load_in_4bit=True)
    assert model.dtype == torch.float32


def test_get_peft_model_targets_every_projection(tiny_dir):
    model, _ = FastLanguageModel.from_pretrained(str(tiny_dir))
    assert default_target_modules(model) == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    peft = FastLanguageModel.get_peft_model(model, r=4, lora_alpha=8)
    trainable = [n for n, p in peft.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert len(trainable) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    assert peft.max_seq_length == model.max_seq_length
    assert peft.is_gradient_checkpointing


def test_rank_above_max_lora_rank(tiny_dir):
    model, _ = FastLanguageModel.from_pretrained(str(tiny_dir), max_lora_rank=8)
    with pytest.raises(ValueError, match="r=16 is larger than max_lora_rank=8"):
        FastLanguageModel.get_peft_model(model, r=16)


def test_random_state_makes_adapter_reproducible(tiny_dir):
    a = FastLanguageModel.get_peft_model(FastLanguageModel.from_pretrained(str(tiny_dir))[0], r=4, random_state=1)
    b = FastLanguageModel.get_peft_model(FastLanguageModel.from_pretrained(str(tiny_dir))[0], r=4, random_state=1)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
