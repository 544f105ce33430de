"""``FastVisionModel`` / ``FastModel`` on vision-language checkpoints saved in the test (three families, random
weights, nothing downloaded): what loads, with which processor, and where ``get_peft_model``'s ``finetune_*``
choices put LoRA."""

from __future__ import annotations

import pytest
import torch

from slimrl.compat.model_state import model_state
from slimrl.verify.tiny_vision import FAMILIES, build, images

VISION_TAGS = ("vision", "visual")


def _saved(tmp_path, family: str):
    tv = build(family)
    tv.model.save_pretrained(tmp_path / family)
    tv.processor.save_pretrained(tmp_path / family)
    return tmp_path / family, tv


def _adapted(model) -> dict[str, list[str]]:
    """The adapted layers (module paths) of a PEFT model, by tower."""
    out: dict[str, list[str]] = {"vision": [], "language": []}
    for name, _ in model.named_parameters():
        if name.endswith("lora_A.default.weight"):
            tower = "vision" if any(t in name for t in VISION_TAGS) else "language"
            out[tower].append(name.removesuffix(".lora_A.default.weight"))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_loads_model_and_processor_and_runs_an_image(tmp_path, family):
    from slimrl import FastModel, FastVisionModel

    path, tv = _saved(tmp_path, family)
    model, processor = FastVisionModel.from_pretrained(str(path), max_seq_length=512)
    assert type(model).__name__ == type(tv.model).__name__ and type(processor).__name__ == type(tv.processor).__name__
    assert model.max_seq_length == 512 and model.dtype == torch.float32  # fp32 on a CPU, as for text models
    assert model_state(model).vision is True
    msgs = [
        [
            {
                "role": "user",
                "content": [
                    {"type": "image", "image": images(1, tv.image_size)[0]},
                    {"type": "text", "text": "How many dots?"},
                ],
            }
        ]
    ]
    batch = processor.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    torch.testing.assert_close(model(**batch).logits, tv.model(**batch).logits)  # the same weights, read back
    again, _ = FastModel.from_pretrained(str(path))  # Unsloth's generic entry point tells it is a VLM too
    assert type(again).__name__ == type(tv.model).__name__


def test_fastmodel_still_loads_text_models(tmp_path):
    from slimrl import FastModel
    from tests.tiny import tiny_llama, tiny_tokenizer

    tiny_llama().save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    model, tokenizer = FastModel.from_pretrained(str(tmp_path))
    assert type(model).__name__ == "LlamaForCausalLM" and model_state(model).vision is False
    assert tokenizer.apply_chat_template is not None and not hasattr(tokenizer, "image_processor")


@pytest.mark.parametrize("family", FAMILIES)
def test_finetune_choices_put_lora_where_asked(tmp_path, family):
    from slimrl import FastVisionModel

    path, _ = _saved(tmp_path, family)

    def adapted(**choices) -> dict[str, list[str]]:
        model, _ = FastVisionModel.from_pretrained(str(path))
        return _adapted(FastVisionModel.get_peft_model(model, r=4, use_gradient_checkpointing=False, **choices))

    both = adapted()  # Unsloth's defaults: every tower, attention and MLP
    assert both["vision"] and both["language"]
    assert adapted(finetune_vision_layers=False) == {"vision": [], "language": both["language"]}
    assert adapted(finetune_language_layers=False) == {"vision": both["vision"], "language": []}
    attention = adapted(finetune_mlp_modules=False)
    mlp = adapted(finetune_attention_modules=False)
    for tower in ("vision", "language"):
        assert attention[tower] and mlp[tower], (tower, attention, mlp)
        assert sorted(attention[tower] + mlp[tower]) == sorted(both[tower])
        assert all("attn" in n or "attention" in n for n in attention[tower])
        assert not any("attn" in n or "attention" in n for n in mlp[tower])
    assert not any("lm_head" in n or "embed" in n for n in both["language"])
    with pytest.raises(ValueError, match="finetune_vision_layers=False and finetune_language_layers=False"):
        adapted(finetune_vision_layers=False, finetune_language_layers=False)


def test_processor_without_torchvision_is_image_only_with_one_line(tmp_path, capsys):
    """Qwen2.5-VL's processor holds a video processor, which needs torchvision; without it the loader rebuilds
    the processor image-only and says so (with torchvision the saved processor loads as it is)."""
    import contextlib
    import importlib.util

    from slimrl.models.vision import load_processor

    path, tv = _saved(tmp_path, "qwen2.5-vl")
    with (
        pytest.warns(UserWarning, match="without its video processor")
        if importlib.util.find_spec("torchvision") is None
        else contextlib.nullcontext()
    ):
        processor = load_processor(str(path))
    out = processor(
        text=["<|vision_start|><|image_pad|><|vision_end|>dots?"], images=images(1, tv.image_size), return_tensors="pt"
    )
    ref = tv.processor(
        text=["<|vision_start|><|image_pad|><|vision_end|>dots?"], images=images(1, tv.image_size), return_tensors="pt"
    )
    assert out.keys() == ref.keys() and all(torch.equal(out[k], ref[k]) for k in ref)


def test_inference_mode_generates_from_an_image_and_training_mode_comes_back(tmp_path):
    from slimrl import FastVisionModel

    path, tv = _saved(tmp_path, "gemma3")
    model, processor = FastVisionModel.from_pretrained(str(path))
    model = FastVisionModel.get_peft_model(model, r=4)
    FastVisionModel.for_inference(model)
    assert not model.training and processor.tokenizer.padding_side == "left"
    msgs = [
        [{"role": "user", "content": [{"type": "image", "image": im}, {"type": "text", "text": "dots?"}]}]
        for im in images(2, tv.image_size)
    ]
    batch = processor.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt", padding=True
    )
    out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert out.shape == (2, batch["input_ids"].shape[1] + 3)
    FastVisionModel.for_training(model)
    assert model.training


def test_load_in_4bit_quantizes_the_language_model(tmp_path):
    from slimrl import FastVisionModel
    from slimrl.compat.quant import bitsandbytes_works

    if not bitsandbytes_works():
        pytest.skip("bitsandbytes cannot run here")
    path, tv = _saved(tmp_path, "qwen2.5-vl")
    model, _ = FastVisionModel.from_pretrained(str(path), load_in_4bit=True)
    kinds = {type(m).__name__ for n, m in model.named_modules() if "language_model" in n}
    assert "Linear4bit" in kinds, kinds
    model = FastVisionModel.get_peft_model(model, r=4, finetune_vision_layers=False)
    assert any(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)
