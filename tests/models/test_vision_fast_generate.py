"""``fast_generate`` on a vision-language model without vLLM, in vLLM's input forms (Unsloth's vision notebooks call
``model.fast_generate({"prompt": text, "multi_modal_data": {"image": img}}, sampling_params)``): the image goes
through the model's processor and reaches the model, the adapter a ``lora_request`` names is active for that call
only, and bad input is one line."""

from __future__ import annotations

import pytest
import torch

from slimrl.verify.tiny_vision import build, images


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    from slimrl import FastVisionModel

    path = tmp_path_factory.mktemp("vlm") / "tiny-qwen2.5-vl"
    tv = build("qwen2.5-vl", seed=3)
    tv.model.save_pretrained(path)
    tv.processor.save_pretrained(path)
    model, processor = FastVisionModel.from_pretrained(str(path), max_seq_length=512)
    model = FastVisionModel.get_peft_model(
        model, r=4, lora_alpha=4, init_lora_weights=False, use_gradient_checkpointing=False
    )
    return model, processor, tv.image_size


def _prompt(processor) -> str:
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many dots?"}]}]
    return processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def _greedy():
    from slimrl import vLLMSamplingParams

    return vLLMSamplingParams(temperature=0.0, max_tokens=12)


def test_the_image_reaches_the_model(vlm):
    model, processor, size = vlm
    text = _prompt(processor)
    first, second = images(2, size, seed=11)
    outs = [
        model.fast_generate({"prompt": text, "multi_modal_data": {"image": img}}, _greedy())[0]
        for img in (first, second, first)
    ]
    assert outs[0].outputs[0].token_ids == outs[2].outputs[0].token_ids  # greedy: the same image, the same answer
    assert outs[0].outputs[0].token_ids != outs[1].outputs[0].token_ids  # another image, another answer
    assert outs[0].prompt == text and len(outs[0].prompt_token_ids) > len(processor.tokenizer(text)["input_ids"])
    as_list = model.fast_generate([{"prompt": text, "multi_modal_data": {"image": [first]}}], _greedy())
    assert as_list[0].outputs[0].token_ids == outs[0].outputs[0].token_ids  # an image list is the same input
    plain = model.fast_generate("How many dots?", _greedy())  # text alone still works on a VLM
    assert plain[0].outputs[0].token_ids


def test_a_lora_request_is_active_for_its_call_only(vlm, tmp_path):
    model, processor, size = vlm
    item = {"prompt": _prompt(processor), "multi_modal_data": {"image": images(1, size, seed=5)[0]}}
    saved = model.save_lora(tmp_path / "lora")
    before = model.fast_generate(item, _greedy())[0].outputs[0].token_ids
    with torch.no_grad():  # the live adapter moves on; the saved one is what the request names
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn_like(p) * 0.5)
    moved = model.fast_generate(item, _greedy())[0].outputs[0].token_ids
    requested = model.fast_generate(item, _greedy(), lora_request=model.load_lora(saved))[0].outputs[0].token_ids
    assert requested == before and moved != before  # the saved adapter generated, and the check is not vacuous
    assert model.active_adapter == "default"
    assert model.fast_generate(item, _greedy())[0].outputs[0].token_ids == moved  # back to the live adapter


def test_bad_input_is_one_line(vlm, tmp_path):
    from slimrl import FastLanguageModel
    from tests.tiny import tiny_llama, tiny_tokenizer

    model, processor, size = vlm
    img = images(1, size)[0]
    with pytest.raises(ValueError, match="multi_modal_data key 'video' is not taken here"):
        model.fast_generate({"prompt": "x", "multi_modal_data": {"video": [img]}}, _greedy())
    with pytest.raises(ValueError, match="needs 'prompt' or 'prompt_token_ids'"):
        model.fast_generate({"text": "x"}, _greedy())
    with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
        model.load_lora(tmp_path)
    tiny_llama().save_pretrained(tmp_path / "text")
    tiny_tokenizer().save_pretrained(tmp_path / "text")
    text_model, _ = FastLanguageModel.from_pretrained(str(tmp_path / "text"), max_seq_length=64)
    with pytest.raises(ValueError, match="an image was given but this model has no image processor"):
        text_model.fast_generate({"prompt": "1+2=", "multi_modal_data": {"image": img}}, _greedy())
