"""A vision-language processor from ``FastVisionModel`` / ``FastModel`` takes chat messages where it takes text, as
Unsloth's does (its Qwen3-VL vision GRPO notebook calls ``tokenizer(image, prompt, ...)`` with ``prompt`` the row's
messages): the same tensors as the chat template rendered by hand, for one conversation, a batch, by position and by
keyword; everything else (a string, a list of strings) reaches transformers' processor unchanged, and the processor
is otherwise transformers' own (class name, ``isinstance``, ``save_pretrained``)."""

from __future__ import annotations

import json

import pytest
import torch

from slimrl.models.chat_processor import accept_chat_messages, render
from slimrl.verify.tiny_vision import FAMILIES, build, images


def _prompt(text: str = "How many dots?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def _same(a, b) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_loaded_processor_takes_the_notebooks_chat_messages(tmp_path, family):
    from slimrl import FastVisionModel

    tv = build(family)
    tv.model.save_pretrained(tmp_path)
    tv.processor.save_pretrained(tmp_path)
    _, processor = FastVisionModel.from_pretrained(str(tmp_path), max_seq_length=512)
    image = images(1, tv.image_size)[0]
    by_hand = tv.processor.apply_chat_template(_prompt(), add_generation_prompt=True, tokenize=False)
    expected = tv.processor(image, by_hand, add_special_tokens=False, return_tensors="pt")
    _same(processor(image, _prompt(), add_special_tokens=False, return_tensors="pt"), expected)  # the notebook's call
    _same(processor(images=image, text=_prompt(), add_special_tokens=False, return_tensors="pt"), expected)
    _same(processor(image, by_hand, add_special_tokens=False, return_tensors="pt"), expected)  # a string: unchanged
    pair = [_prompt("How many dots?"), _prompt("Which colour?")]
    rendered = [tv.processor.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in pair]
    kwargs = dict(padding=True, add_special_tokens=False, return_tensors="pt")
    _same(
        processor(images=[[image], [image]], text=pair, **kwargs),
        tv.processor(images=[[image], [image]], text=rendered, **kwargs),
    )
    import transformers

    name = type(tv.processor).__name__
    assert type(processor).__name__ == name and isinstance(processor, getattr(transformers, name))
    processor.save_pretrained(tmp_path / "saved")
    saved = json.loads(next((tmp_path / "saved").glob("processor_config.json")).read_text())
    assert saved.get("processor_class", type(tv.processor).__name__) == type(tv.processor).__name__


def test_qwen3_vl_processor_takes_chat_messages():
    """Qwen3-VL's processor (the notebook's), built around the tiny Qwen2.5-VL's tokenizer and image processor: its
    ``__call__`` takes ``(images, text, videos, ...)`` as Qwen2.5-VL's does."""
    from transformers import Qwen3VLProcessor

    from slimrl.models.vision import image_only

    tv = build("qwen2.5-vl")
    plain = image_only(Qwen3VLProcessor)(
        image_processor=tv.processor.image_processor,
        tokenizer=tv.processor.tokenizer,
        chat_template=tv.processor.chat_template,
    )
    processor = accept_chat_messages(
        image_only(Qwen3VLProcessor)(
            image_processor=tv.processor.image_processor,
            tokenizer=tv.processor.tokenizer,
            chat_template=tv.processor.chat_template,
        )
    )
    image = images(1, tv.image_size)[0]
    text = plain.apply_chat_template(_prompt(), add_generation_prompt=True, tokenize=False)
    _same(processor(image, _prompt(), return_tensors="pt"), plain(image, text, return_tensors="pt"))
    with pytest.raises(ValueError, match="must be a string"):  # what the notebook met without slimrl
        plain(image, _prompt(), return_tensors="pt")


def test_a_conversation_that_ends_with_the_answer_gets_no_generation_prompt():
    tv = build("idefics3")
    processor = accept_chat_messages(tv.processor)
    done = [*_prompt(), {"role": "assistant", "content": [{"type": "text", "text": "3"}]}]
    assert render(processor, done) == tv.processor.apply_chat_template(
        done, add_generation_prompt=False, tokenize=False
    )
    assert render(processor, ["a", "b"]) == ["a", "b"] and render(processor, "a") == "a"
    assert accept_chat_messages(processor) is processor  # once


def test_a_tokenizer_without_chat_template_support_is_returned_as_it_is():
    class NoTemplate:
        def __call__(self, text=None):
            return text

    thing = NoTemplate()
    assert accept_chat_messages(thing) is thing and type(thing) is NoTemplate
