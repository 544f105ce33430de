"""Unsloth's ``from_pretrained`` / ``get_peft_model`` keywords are never a TypeError: each is honoured, passed to
transformers/PEFT, or ignored with one line (slimrl.models.unsloth_keywords), and the README's table is the
declared one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from slimrl.compat.model_state import model_state
from slimrl.models import FastLanguageModel, FastModel, unsloth_keywords

ROOT = Path(__file__).resolve().parents[2]


def test_readme_table_is_the_declared_one():
    assert unsloth_keywords.keyword_table() in (ROOT / "docs" / "compatibility.md").read_text()


def test_every_unsloth_keyword_of_the_gpt_oss_and_grpo_notebooks_loads(tiny_model_dir, capfd):
    unsloth_keywords._SAID.clear()
    model, tok = FastLanguageModel.from_pretrained(
        str(tiny_model_dir),
        max_seq_length=128,
        load_in_4bit=False,
        offload_embedding=True,
        full_finetuning=False,
        use_exact_model_name=True,
        float8_kv_cache=False,
        unsloth_vllm_standby=True,
        random_state=3407,
        fix_tokenizer=True,
        disable_log_stats=True,
        load_in_16bit=True,
        unsloth_tiled_mlp=False,
        use_gradient_checkpointing="unsloth",
    )
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("slimrl: from_pretrained(")]
    assert lines == [
        "slimrl: from_pretrained(offload_embedding=True) ignored: the input embedding stays with the "
        "model (on a CPU it is in host memory already)"
    ]  # only what was asked and is not done
    peft = FastLanguageModel.get_peft_model(
        model,
        r=4,
        lora_alpha=8,
        random_state=3407,
        use_rslora=True,
        loftq_config={},
        temporary_location="_unsloth_temporary_saved_buffers",
        max_seq_length=96,
    )
    assert peft.peft_config["default"].use_rslora is True and peft.max_seq_length == 96
    assert model_state(peft).checkpointing == "unsloth"  # from_pretrained's default taken


def test_transformers_alone_refuses_offload_embedding(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    with pytest.raises(TypeError, match="offload_embedding"):
        AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), offload_embedding=True)


def test_attention_or_mlp_only(tiny_model_dir):
    model, _ = FastModel.from_pretrained(str(tiny_model_dir), max_seq_length=64)
    peft = FastModel.get_peft_model(model, r=4, finetune_mlp_modules=False)
    lora = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in peft.named_parameters() if "lora_A" in n}
    assert lora == {"q_proj", "k_proj", "v_proj", "o_proj"}
    model, _ = FastModel.from_pretrained(str(tiny_model_dir), max_seq_length=64)
    peft = FastModel.get_peft_model(model, r=4, finetune_attention_modules=False, finetune_vision_layers=True)
    lora = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in peft.named_parameters() if "lora_A" in n}
    assert lora == {"gate_proj", "up_proj", "down_proj"}
    with pytest.raises(ValueError, match="finetune_language_layers=False"):
        FastModel.get_peft_model(model, r=4, finetune_language_layers=False)


def test_full_finetuning_trains_every_weight_without_an_adapter(tiny_model_dir, capfd):
    model, _ = FastLanguageModel.from_pretrained(
        str(tiny_model_dir), max_seq_length=64, full_finetuning=True, load_in_4bit=True
    )
    same = FastLanguageModel.get_peft_model(model, r=8, use_gradient_checkpointing=False)
    assert same is model and not any("lora" in n for n, _ in model.named_parameters())
    assert all(p.requires_grad for p in model.parameters())
    assert not any("4bit" in type(m).__name__.lower() for m in model.modules())
    err = capfd.readouterr().err
    assert "from_pretrained(full_finetuning=True): the model loads unquantized" in err
    assert re.search(r"get_peft_model: .*full_finetuning=True: no adapter added", err)
    ids = torch.tensor([[1, 5, 9]])
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.get_input_embeddings().weight.grad is not None


def test_resize_model_vocab(tiny_model_dir):
    model, _ = FastLanguageModel.from_pretrained(str(tiny_model_dir), max_seq_length=64, resize_model_vocab=80)
    assert model.get_input_embeddings().weight.shape[0] == 80
