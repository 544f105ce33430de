"""for_inference / for_training: generation equals plain HF generate; training state restored exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from slimrl import FastLanguageModel


@pytest.fixture
def peft_model(tiny_model_dir):
    model, tok = FastLanguageModel.from_pretrained(str(tiny_model_dir))
    model = FastLanguageModel.get_peft_model(model, r=4, lora_dropout=0.1, init_lora_weights=False)
    return model, tok


def _state(model):
    return (
        {n: m.training for n, m in model.named_modules()},
        {n: p.requires_grad for n, p in model.named_parameters()},
        {n: m.gradient_checkpointing for n, m in model.named_modules() if hasattr(m, "gradient_checkpointing")},
        model.get_base_model().config.use_cache,
    )


def test_for_inference_generate_equals_hf_generate(peft_model):
    """Reference: an independent copy in plain HF eval mode. The adapter has dropout 0.1, so generating in
    the trainer's train mode would not match: the switch is what makes them equal."""
    model, tok = peft_model
    ref = copy.deepcopy(model)
    ref.eval()
    model.train()
    tok.padding_side = "right"
    FastLanguageModel.for_inference(model)
    assert tok.padding_side == "left"
    batch = tok(["12+3=", "7="], return_tensors="pt", padding=True)
    ours = model.generate(**batch, max_new_tokens=10, do_sample=False)
    theirs = ref.generate(**batch, max_new_tokens=10, do_sample=False)
    assert torch.equal(ours, theirs)


def test_for_training_restores_exact_state(peft_model):
    model, tok = peft_model
    model.train()
    # a state a trainer might have: one parameter frozen by hand, one module in eval
    first_lora = next(p for n, p in model.named_parameters() if "lora_A" in n)
    first_lora.requires_grad_(False)
    model.get_base_model().model.layers[1].eval()
    tok.padding_side = "right"
    before = _state(model)
    assert any(before[2].values())  # checkpointing on (get_peft_model default)

    FastLanguageModel.for_inference(model)
    during = _state(model)
    assert not any(during[0].values()) and not any(during[2].values()) and during[3] is True
    FastLanguageModel.for_training(model)
    assert _state(model) == before
    assert tok.padding_side == "right"


def test_for_training_without_for_inference(peft_model):
    model, _ = peft_model
    model.eval()
    FastLanguageModel.for_training(model)
    assert model.training and model.get_base_model().config.use_cache is False
