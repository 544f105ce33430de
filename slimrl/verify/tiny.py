"""Tiny random models for ``slimrl verify``: the default tiny Llama with a character tokenizer, or a shrunk copy of
the user's model config (same architecture, vocabulary, head tying, soft-capping; 2 layers, narrow), built from the
config only (no weights read)."""

from __future__ import annotations

from typing import Any

import torch

CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789 +-=?.,<>/")
SPECIAL = ["<pad>", "<eos>", "<unk>"]
HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 64, 4, 2, 2, 128


def char_tokenizer():
    """Character-level fast tokenizer: 3 specials + 46 characters (vocab 49, not a power of two)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


CHAT_SPECIAL = [
    "<pad>",
    "<|im_end|>",
    "<unk>",
    "<|im_start|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]


def chatml_char_tokenizer(specials: list[str], vocab_size: int | None = None, **extra_special_tokens: str):
    """Character-level fast tokenizer: ``specials`` as whole tokens (the first three are pad, eos and unk; the rest
    additional special tokens), then every printable ASCII character and newline as one token each, then filler
    entries up to ``vocab_size`` (text never produces them; sampled ids decode to them); decoding by plain
    concatenation. ``extra_special_tokens`` names more of ``specials`` (e.g. Gemma 3's ``boi_token``)."""
    import string

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = specials + [c for c in string.printable if c not in "\r\x0b\x0c"]
    words += [f"<|v{i}|>" for i in range(len(words), vocab_size or 0)]
    tk = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(words)}, unk_token=specials[2]))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token=specials[0],
        eos_token=specials[1],
        unk_token=specials[2],
        extra_special_tokens=extra_special_tokens or None,
    )
    tok.add_special_tokens({"additional_special_tokens": specials[3:]})
    return tok


def chat_tokenizer():
    """Character-level fast tokenizer for tool calling (:func:`chatml_char_tokenizer`): Qwen3's chat markers as
    whole tokens (pad 0, eos ``<|im_end|>`` 1; vocab 107), and TRL's Qwen3 chat template with its response template
    (so TRL's response parser reads the JSON of a tool call back): what TRL's agentic GRPO needs from a tokenizer,
    without a download."""
    from trl.chat_template_utils import add_response_schema, qwen3_chat_template

    tok = chatml_char_tokenizer(CHAT_SPECIAL)
    tok.chat_template = qwen3_chat_template
    return add_response_schema(tok)


def llama_config(**overrides: Any):
    """A tiny Llama config for the character tokenizer: 2 layers, hidden 64, 4 heads (2 KV), vocab 49 (not a power
    of two), tied head, fp32; ``overrides`` change any field (the tests' models are narrower)."""
    from transformers import LlamaConfig

    cfg = dict(
        vocab_size=len(SPECIAL) + len(CHARS),
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        dtype="float32",
    )
    return LlamaConfig(**{**cfg, **overrides})


def default_config():
    """The tiny Llama ``slimrl verify`` runs on (:func:`llama_config` as it is)."""
    return llama_config()


def shrink(config: Any) -> Any:
    """``config`` with 2 layers and a narrow width; everything that changes the head's math kept (vocabulary, head
    tying, logit soft-capping and scaling, architecture)."""
    import copy

    small = copy.deepcopy(config)
    text = small.get_text_config() if hasattr(small, "get_text_config") else small
    text.num_hidden_layers = LAYERS
    text.hidden_size = HIDDEN
    text.num_attention_heads = HEADS
    if getattr(text, "num_key_value_heads", None) is not None:
        text.num_key_value_heads = KV_HEADS
    if getattr(text, "head_dim", None) is not None:
        text.head_dim = HIDDEN // HEADS
    for name in ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"):
        if getattr(text, name, None) is not None:
            setattr(text, name, FFN)
    for name in ("layer_types", "sliding_window_pattern"):  # per-layer lists follow the layer count
        value = getattr(text, name, None)
        if isinstance(value, list):
            setattr(text, name, value[:LAYERS])
    if getattr(text, "max_window_layers", None) is not None:
        text.max_window_layers = LAYERS
    return small


def build(
    config: Any,
    seed: int,
    kind: str = "causal",
    dtype: torch.dtype = torch.float32,
    quantized: str | None = None,
    device: str = "cpu",
):
    """A random model of ``config`` (``kind``: "causal" LM, or "scorer": one-score sequence classifier);
    ``quantized="4bit"`` / ``"8bit"``: the same weights quantized by bitsandbytes (NF4 with double quantization,
    compute in ``dtype``, as ``FastLanguageModel.from_pretrained(load_in_4bit=True)`` loads; or LLM.int8()) on
    ``device``."""
    if quantized is not None:
        return _quantized(build(config, seed, kind, dtype), quantized, dtype, device)
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    if kind == "scorer":
        import copy

        config = copy.deepcopy(config)
        config.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(config, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    pad = getattr(config, "pad_token_id", None)
    if pad is not None and getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = pad
    return model


def _quantized(model: torch.nn.Module, bits: str, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """``model`` saved and loaded back through transformers with a bitsandbytes quantization config, the way users
    get a quantized base (nothing of slimrl's applied: the patched trainer must prepare it itself)."""
    import tempfile

    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    config = (
        BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype, bnb_4bit_use_double_quant=True
        )
        if bits == "4bit"
        else BitsAndBytesConfig(load_in_8bit=True)
    )
    with tempfile.TemporaryDirectory(prefix="slimrl-verify-q") as tmp:
        model.save_pretrained(tmp)
        out = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=config, dtype=dtype, device_map=device)
    out.generation_config.pad_token_id = model.generation_config.pad_token_id
    return out
