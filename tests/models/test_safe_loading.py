"""Safe defaults of FastLanguageModel.from_pretrained: safetensors only, no remote code unless asked."""

from __future__ import annotations

import pytest

from slimrl import FastLanguageModel
from tests.tiny import tiny_llama, tiny_tokenizer


def test_pickle_only_checkpoint_is_refused_with_the_way_out(tmp_path):
    import torch

    model = tiny_llama()
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "m" / "pytorch_model.bin")  # a pickle-only checkpoint
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    assert not list((tmp_path / "m").glob("*.safetensors"))
    with pytest.raises(
        ValueError,
        match=r"has no \.safetensors weights .* slimrl loads safetensors only by "
        r"default; convert the checkpoint .* pass use_safetensors=False",
    ):
        FastLanguageModel.from_pretrained(str(tmp_path / "m"), max_seq_length=64)
    model, _ = FastLanguageModel.from_pretrained(str(tmp_path / "m"), max_seq_length=64, use_safetensors=False)
    assert model.max_seq_length == 64  # the explicit opt-in loads it


def test_no_remote_code_unless_passed(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    tiny_llama().save_pretrained(tmp_path / "m")
    tiny_tokenizer().save_pretrained(tmp_path / "m")
    seen = {}
    real = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    FastLanguageModel.from_pretrained(str(tmp_path / "m"), max_seq_length=64)
    assert seen["trust_remote_code"] is False and seen["use_safetensors"] is True
    FastLanguageModel.from_pretrained(str(tmp_path / "m"), max_seq_length=64, trust_remote_code=True)
    assert seen["trust_remote_code"] is True
