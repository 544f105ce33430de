"""A vision-language processor that takes chat messages where it takes text, as Unsloth's loaders return it.

Unsloth's vision notebooks call the processor with a prompt's chat messages (``tokenizer(image, prompt,
return_tensors="pt")``, ``prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", ...}]}]``);
transformers' processors take only strings there (``ValueError: `text` must be a string or list of strings``).
:func:`accept_chat_messages` gives a loaded processor a ``__call__`` that renders such messages with the processor's
own chat template first — one conversation, or a batch of them — and passes everything else through unchanged. The
generation prompt is added unless the conversation ends with the assistant's turn (the prompt then continues it).

The processor stays transformers' own object: its class is swapped for a subclass with the same name and module
that adds only that ``__call__`` (``isinstance`` checks, ``save_pretrained``'s ``processor_class`` and pickling see
the original class).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

_SUBCLASSES: dict[type, type] = {}


def is_conversation(value: Any) -> bool:
    """A non-empty list of chat messages (dicts with a ``role``)."""
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def render(processor: Any, text: Any) -> Any:
    """``text`` with each conversation in it rendered by ``processor``'s chat template (module docstring)."""
    if is_conversation(text):
        return _render_one(processor, list(text))
    if isinstance(text, list | tuple) and text and all(is_conversation(t) for t in text):
        return [_render_one(processor, list(t)) for t in text]
    return text


def _render_one(processor: Any, messages: list[dict]) -> str:
    ends_with_answer = messages[-1].get("role") == "assistant"
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=not ends_with_answer)


def _text_position(cls: type) -> int | None:
    """The position of ``text`` among ``cls.__call__``'s positional parameters (``self`` not counted)."""
    try:
        params = list(inspect.signature(cls.__call__).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return positional.index("text") if "text" in positional else None


def _subclass(cls: type) -> type:
    if cls not in _SUBCLASSES:
        position = _text_position(cls)
        original = cls.__call__

        @functools.wraps(original)
        def __call__(self, *args, **kwargs):  # noqa: N807
            if "text" in kwargs:
                kwargs["text"] = render(self, kwargs["text"])
            elif position is not None and len(args) > position:
                args = (*args[:position], render(self, args[position]), *args[position + 1 :])
            return original(self, *args, **kwargs)

        _SUBCLASSES[cls] = type(
            cls.__name__,
            (cls,),
            {
                "__call__": __call__,
                "__module__": cls.__module__,
                "__qualname__": cls.__qualname__,
                "__doc__": cls.__doc__,
                "slimrl_chat_messages": True,
            },
        )
    return _SUBCLASSES[cls]


def accept_chat_messages(processor: Any) -> Any:
    """``processor`` (a vision-language processor with a chat template) taking chat messages as text (module
    docstring); anything without ``apply_chat_template`` is returned as it is."""
    cls = type(processor)
    if getattr(cls, "slimrl_chat_messages", False) or not callable(getattr(processor, "apply_chat_template", None)):
        return processor
    processor.__class__ = _subclass(cls)
    return processor
