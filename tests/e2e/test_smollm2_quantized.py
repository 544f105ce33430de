"""The real SmolLM2-135M in 4-bit: LoRA gradients after ``for_inference`` -> generate -> ``for_training`` equal a
fresh copy's (tests/models/test_quantized.py explains the bug and the ``avx512bf16`` fixture). Tolerance 1e-5
relative: the same quantized weights and batch on both sides, fp32 compute."""

from __future__ import annotations

import pytest
import torch

from slimrl import FastLanguageModel

pytestmark = pytest.mark.e2e
pytest.importorskip("bitsandbytes", minversion="0.50")


def _lora():
    model, tok = FastLanguageModel.from_pretrained("SmolLM2-135M-Instruct", max_seq_length=128, load_in_4bit=True)
    return FastLanguageModel.get_peft_model(
        model, r=8, lora_alpha=16, init_lora_weights=False, random_state=5, use_gradient_checkpointing=False
    ), tok


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU backend of bitsandbytes (tests/gpu: CUDA)")
def test_4bit_smollm2_gradients_after_generation(avx512bf16):
    import bitsandbytes as bnb

    (fresh, tok), (used, _) = _lora(), _lora()
    assert sum(isinstance(m, bnb.nn.Linear4bit) for m in used.modules()) == 30 * 7
    batch = tok(
        ["What is 2+3? The answer is 5.", "Name a colour: blue, or maybe green."], return_tensors="pt", padding=True
    )
    FastLanguageModel.for_inference(used)
    with torch.no_grad():
        used.generate(**tok(["What is 2+3?"], return_tensors="pt"), max_new_tokens=4, do_sample=False)
    FastLanguageModel.for_training(used)

    def grads(model):
        model.train()
        model(**batch, labels=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)).loss.backward()
        return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}

    a, b = grads(used), grads(fresh)
    assert a.keys() == b.keys() and len(a) == 30 * 7 * 2
    worst = max(float((a[n] - b[n]).norm() / b[n].norm()) for n in a)
    assert worst <= 1e-5, worst
