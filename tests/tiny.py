"""Tiny models and tokenizers built from a config in the test (no downloads)."""

from __future__ import annotations

import torch


def tiny_tokenizer():
    """Character-level fast tokenizer: vocab of 3 specials + 46 characters (slimrl verify's own)."""
    from slimrl.verify.tiny import char_tokenizer

    return char_tokenizer()


def tiny_llama(seed: int = 0, vocab_size: int = 49, tie: bool = True, **overrides):
    """2-layer Llama, hidden 32, vocab 49 (not a power of two), fp32, deterministic from ``seed``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               tie_word_embeddings=tie, pad_token_id=0, eos_token_id=1, bos_token_id=None)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 1
    return model


def tiny_llama_scorer(seed: int = 0, **overrides):
    """The same 2-layer Llama with a one-score head (``LlamaForSequenceClassification``, num_labels=1): a reward
    model for RewardTrainer."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    cfg = dict(vocab_size=49, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
               bos_token_id=None, num_labels=1)
    cfg.update(overrides)
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(LlamaConfig(**cfg))


# Config keywords every CPU test passes (no reporting, fp32 on the CPU, no checkpoints written).
CPU_ARGS = dict(report_to="none", use_cpu=True, bf16=False, save_strategy="no")
