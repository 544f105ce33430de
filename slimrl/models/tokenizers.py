"""The tokenizer ``FastLanguageModel.from_pretrained`` returns, as Unsloth-era scripts use it.

Those scripts were written for transformers 4, where ``tokenizer.apply_chat_template(messages, tokenize=True)``
returns the token ids (a list, or a tensor with ``return_tensors``) and
``dataset.map(lambda x: {"tokens": tokenizer.apply_chat_template(x["prompt"], ...)}, batched=True)`` stores them;
transformers 5 returns a ``BatchEncoding`` there unless ``return_dict=False`` is passed, which ``datasets`` refuses
and ``model.generate(input_ids=...)`` cannot take. On this one tokenizer object, a call that tokenizes and does not
say ``return_dict`` gets ``return_dict=False``: the ids, as those scripts expect. A call that passes
``return_dict`` (TRL's own calls always do) is unchanged, as is every other tokenizer.
"""

from __future__ import annotations

import functools
from typing import Any


def with_token_id_chat_templates(tokenizer: Any) -> Any:
    """``tokenizer`` with :meth:`apply_chat_template` defaulting to ``return_dict=False`` when it tokenizes (module
    docstring); returns it."""
    original = getattr(tokenizer, "apply_chat_template", None)
    if original is None or getattr(original, "_slimrl_token_ids", False):
        return tokenizer

    @functools.wraps(original)
    def apply_chat_template(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("tokenize", True) and "return_dict" not in kwargs:
            kwargs["return_dict"] = False
        return original(*args, **kwargs)

    apply_chat_template._slimrl_token_ids = True
    tokenizer.apply_chat_template = apply_chat_template
    return tokenizer
