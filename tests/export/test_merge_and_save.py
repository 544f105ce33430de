"""Merged models equal the PEFT model they come from; the adapter saves, reloads and generates; a failed export
leaves nothing behind. Tolerances: an fp32 base 1e-5 relative on the logits (the merged ``W + BA`` and the PEFT
model's ``Wx + BAx`` differ only by fp32 rounding); a 4-bit base with fp32 compute the same 1e-5 (the base is
dequantized exactly once on both sides, the delta added in fp32, never re-quantized); a bf16 base 2e-2 (the merged
weight is rounded to bf16 once, 8 mantissa bits, where the PEFT model rounds W and the delta separately)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from slimrl import FastLanguageModel
from slimrl.export.merge import merged_model
from tests.tiny import tiny_llama, tiny_tokenizer

IDS = torch.randint(3, 49, (2, 12), generator=torch.Generator().manual_seed(2))  # [B, T]


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "tiny"
    tiny_llama(hidden_size=64, intermediate_size=128).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _lora(path, **load):
    model, tok = FastLanguageModel.from_pretrained(str(path), max_seq_length=64, **load)
    return FastLanguageModel.get_peft_model(
        model, r=8, lora_alpha=16, init_lora_weights=False, random_state=4, use_gradient_checkpointing=False
    ), tok


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _logits(model) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()  # [B, T, V]


@pytest.mark.parametrize("load, tol", [({}, 1e-5), ({"dtype": torch.bfloat16}, 2e-2)])
def test_merged_logits_equal_the_peft_models(model_dir, load, tol):
    model, _ = _lora(model_dir, **load)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ref = _logits(model)
    merged = merged_model(model)
    assert merged.dtype == model.get_base_model().get_input_embeddings().weight.dtype
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert _rel(_logits(merged), ref) <= tol
    assert _rel(_logits(model), ref) == 0  # the PEFT model is untouched
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_4bit_base_merges_without_requantizing(model_dir):
    pytest.importorskip("bitsandbytes", minversion="0.50")
    model, _ = _lora(model_dir, load_in_4bit=True, dtype=torch.float32)
    ref = _logits(model)
    merged = merged_model(model)
    assert merged.dtype == torch.float32 and "quantization_config" not in merged.config.to_dict()
    assert _rel(_logits(merged), ref) <= 1e-5
    # what PEFT's own merge does on a 4-bit base (quantize W + BA back to NF4): measurably further away
    peft_merged = model.merge_and_unload()
    assert _rel(_logits(peft_merged), ref) > 100 * 1e-5


def test_save_merged_reloads_to_the_same_logits(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    model, tok = _lora(model_dir)
    ref = _logits(model)
    out = model.save_pretrained_merged(tmp_path / "merged", tok)
    reloaded = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert _rel(_logits(reloaded), ref) <= 1e-5
    assert (out / "tokenizer.json").is_file() and not list(tmp_path.glob(".merged.partial-*"))


def test_lora_saves_reloads_and_generates_with_the_saved_adapter(model_dir, tmp_path):
    from slimrl.sampling import vLLMSamplingParams

    model, tok = _lora(model_dir)
    path = model.save_lora(tmp_path / "lora")
    assert (path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file()
    greedy = vLLMSamplingParams(temperature=0.0, max_tokens=8)
    trained = model.fast_generate(["1+2=", "3+4="], sampling_params=greedy)
    with torch.no_grad():  # the live adapter moves on; the saved one must still be what generates below
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p))
    moved = model.fast_generate(["1+2="], sampling_params=greedy)[0].outputs[0].token_ids
    request = model.load_lora(path)
    saved = model.fast_generate(["1+2=", "3+4="], sampling_params=greedy, lora_request=request)
    assert [o.outputs[0].token_ids for o in saved] == [o.outputs[0].token_ids for o in trained]
    assert moved != trained[0].outputs[0].token_ids  # the comparison above is not vacuous
    assert model.active_adapter == "default"  # the saved adapter was active for that call only


def test_fast_generate_without_an_adapter_and_bad_paths(model_dir, tmp_path):
    model, tok = FastLanguageModel.from_pretrained(str(model_dir), max_seq_length=64)
    out = model.fast_generate("1+2=")  # vLLM's default sampling: 16 tokens at temperature 1
    assert out[0].prompt == "1+2=" and 0 < len(out[0].outputs[0].token_ids) <= 16
    with pytest.raises(FileNotFoundError, match="load_lora.*no adapter_config.json there"):
        model.load_lora(tmp_path)
    with pytest.raises(ValueError, match="save_lora: the model has no LoRA adapter"):
        model.save_lora(tmp_path / "x")


def test_a_failed_export_leaves_no_partial_file_and_keeps_the_rest(model_dir, tmp_path, monkeypatch):
    model, tok = _lora(model_dir)
    target = tmp_path / "out"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    model.save_lora(target)
    adapter = (target / "adapter_model.safetensors").read_bytes()
    import transformers

    def broken(self, directory, *args, **kwargs):
        (Path(directory) / "model.safetensors").write_bytes(b"half")
        raise OSError("disk full (injected)")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", broken)
    with pytest.raises(OSError, match="disk full"):  # overwrite: a merged model may replace the adapter's export
        model.save_pretrained_merged(target, tok, overwrite=True)
    assert sorted(p.name for p in target.iterdir()) == sorted(
        [
            "notes.txt",
            "adapter_model.safetensors",
            "adapter_config.json",
            "README.md",
            "tokenizer.json",
            "tokenizer_config.json",
            ".slimrl-export.json",
        ]
        + (["chat_template.jinja"] if (target / "chat_template.jinja").exists() else [])
    )
    assert (target / "adapter_model.safetensors").read_bytes() == adapter
    assert not list(tmp_path.glob(".out.partial-*"))


def test_merged_weights_leave_the_device_layer_by_layer(model_dir, monkeypatch):
    """On a GPU the merge must not hold the whole merged model on the device: each merged tensor is moved to host
    memory as it is made. A model on the meta device stands for the GPU here; ``_to_host`` records the order."""
    from slimrl.export import merge

    model, _ = _lora(model_dir)
    model.to("meta")
    moved = []

    def to_host(t):
        moved.append((t.device.type, len(moved)))
        assert len([d for d, _ in moved if d == "meta"]) == len(moved), "a tensor reached the host unmoved"
        return torch.empty_like(t, device="cpu")

    monkeypatch.setattr(merge, "_to_host", to_host)
    state = merge.merged_state_dict(model)
    assert moved and all(t.device.type == "cpu" for t in state.values())
    assert len(moved) == len(state)
