"""A LoRA adapter TRL puts on the model (``peft_config=``) is computed by slimrl's fused ops once the trainer is
built (:func:`slimrl.patching.every_trainer.trainer_init.fuse_trl_adapter`), as ``get_peft_model``'s are; one that
``get_peft_model(..., fused_lora=False)`` made keeps PEFT's layers; unpatched TRL fuses nothing."""

from __future__ import annotations

import pytest
from datasets import Dataset

from slimrl import FastLanguageModel, PatchFastRL, unpatch
from slimrl.models.fused_lora import is_fused
from tests.tiny import CPU_ARGS, tiny_llama, tiny_tokenizer


def _trainer(tmp_path, model, peft_config=None):
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "out"), max_steps=1, dataset_text_field="text", **CPU_ARGS)
    data = Dataset.from_list([{"text": "1+2=3"}] * 2)
    return SFTTrainer(
        model=model, args=args, train_dataset=data, processing_class=tiny_tokenizer(), peft_config=peft_config
    )


@pytest.mark.parametrize("patched_trl", [True, False])
def test_trl_s_own_adapter_is_fused_under_the_patch(tmp_path, patched_trl):
    from peft import LoraConfig

    unpatch()
    if patched_trl:
        PatchFastRL()
    trainer = _trainer(tmp_path, tiny_llama(), LoraConfig(r=4, target_modules="all-linear"))
    assert hasattr(trainer.model, "peft_config") and is_fused(trainer.model) is patched_trl


@pytest.mark.parametrize("fused", [True, False])
def test_get_peft_model_s_word_is_kept(tmp_path, fused):
    PatchFastRL()
    path = tmp_path / "tiny"
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    model, _ = FastLanguageModel.from_pretrained(str(path), max_seq_length=64)
    model = FastLanguageModel.get_peft_model(model, r=4, fused_lora=fused)
    assert is_fused(model) is fused
    assert is_fused(_trainer(tmp_path, model).model) is fused


def test_fused_lora_takes_a_bool(tmp_path):
    path = tmp_path / "tiny"
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    model, _ = FastLanguageModel.from_pretrained(str(path), max_seq_length=64)
    with pytest.raises(ValueError, match="fused_lora must be True or False"):
        FastLanguageModel.get_peft_model(model, r=4, fused_lora="yes")


def test_liger_is_wanted_on_cuda_where_installed_and_trl_does_not_apply_it(monkeypatch):
    from types import SimpleNamespace

    from slimrl.models import liger

    model = tiny_llama()
    monkeypatch.setattr(liger, "liger_installed", lambda: True)
    assert not liger.wanted(model, SimpleNamespace())  # its weights are on the CPU
    monkeypatch.setattr(liger, "_on_cuda", lambda m: True)
    assert liger.wanted(model, SimpleNamespace())
    assert not liger.wanted(model, SimpleNamespace(use_liger_kernel=True))  # TRL applies its own
    monkeypatch.setattr(liger, "liger_installed", lambda: False)
    assert not liger.wanted(model, SimpleNamespace())


@pytest.mark.parametrize("fused", [True, False])
def test_the_trainer_asks_liger_for_its_mlp_only_where_the_fused_mlp_does_not_serve(tmp_path, monkeypatch, fused):
    from peft import LoraConfig, get_peft_model

    from slimrl.models import liger
    from slimrl.models.fused_lora import fuse_lora

    asked = []
    monkeypatch.setattr(liger, "wanted", lambda model, args: True)
    monkeypatch.setattr(liger, "apply_liger", lambda model, swiglu: asked.append(swiglu) or ())
    PatchFastRL()
    model = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules="all-linear"))
    if fused:
        fuse_lora(model)
    else:
        from slimrl.compat.model_state import ModelState, attach_state

        attach_state(model, ModelState(fused_lora=False))  # get_peft_model(..., fused_lora=False)'s word
    _trainer(tmp_path, model)
    assert asked == [not fused]
