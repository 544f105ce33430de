"""Tiny models and tokenizers built from a config in the test (no downloads): the ones ``slimrl verify`` builds
(:mod:`slimrl.verify.tiny`), narrower by default."""

from __future__ import annotations

NARROW = dict(hidden_size=32, intermediate_size=64, tie_word_embeddings=True)  # the tests' default width


def tiny_tokenizer():
    """Character-level fast tokenizer: vocab of 3 specials + 46 characters (slimrl verify's own)."""
    from slimrl.verify.tiny import char_tokenizer

    return char_tokenizer()


def tiny_llama(seed: int = 0, vocab_size: int = 49, tie: bool = True, **overrides):
    """2-layer Llama, hidden 32, vocab 49 (not a power of two), fp32, deterministic from ``seed``."""
    from slimrl.verify.tiny import build, llama_config

    config = llama_config(
        **{**NARROW, "vocab_size": vocab_size, "tie_word_embeddings": tie, "dtype": None, **overrides}
    )
    model = build(config, seed)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 1
    return model


def tiny_llama_scorer(seed: int = 0, **overrides):
    """The same 2-layer Llama with a one-score head (``LlamaForSequenceClassification``, num_labels=1): a reward
    model for RewardTrainer."""
    from slimrl.verify.tiny import build, llama_config

    return build(
        llama_config(**{**NARROW, "tie_word_embeddings": False, "dtype": None, **overrides}), seed, kind="scorer"
    )


# Config keywords every CPU test passes (no reporting, fp32 on the CPU, no checkpoints written).
CPU_ARGS = dict(report_to="none", use_cpu=True, bf16=False, save_strategy="no")


HYBRID = {  # text models whose decoder mixes attention with convolution (LFM2) or Gated-DeltaNet (Qwen3.5) layers
    "lfm2": dict(layer_types=["conv", "full_attention"]),
    "qwen3_5_text": dict(
        layer_types=["linear_attention", "full_attention"],
        head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
    ),
}


def tiny_hybrid(model_type: str, seed: int = 0):
    """A 2-layer hybrid-attention causal LM (:data:`HYBRID`), hidden 32, vocab 49 (the tiny tokenizer's), fp32."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=True,
        **HYBRID[model_type],
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = 1
    return model


# Decoder families the engine must serve (the ones Unsloth's and TRL's notebooks train), as config overrides of a
# 2-layer model, hidden 128, 4 heads of 32 (2 KV): vLLM's CPU attention has kernels for head sizes of 32 and up.
FAMILIES = {
    "llama": {},
    "qwen2": {},  # q/k/v with biases (the loader must add each once)
    "qwen3": dict(head_dim=32),
    "mistral": dict(head_dim=32),
    "gemma3_text": dict(head_dim=32, sliding_window=16, layer_types=["sliding_attention", "full_attention"]),
    "phi3": {},
}
# Phi-3's LongRoPE (its own rotary tables): the shared loader does not map it, vLLM's default loader does
PHI3_LONGROPE = dict(
    original_max_position_embeddings=128,
    max_position_embeddings=256,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0] * 16,
        "long_factor": [2.0] * 16,
    },
)


def save_tiny_family(model_type: str, directory, seed: int = 0, **overrides) -> str:
    """A random 2-layer ``model_type`` (:data:`FAMILIES`) saved with a character tokenizer (vocab 107) in
    ``directory``, every bias non-zero (transformers initialises them at 0, which would hide a bias added twice);
    returns the directory as a string."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from slimrl.verify.tiny import CHAT_SPECIAL, chatml_char_tokenizer

    tok = chatml_char_tokenizer(CHAT_SPECIAL)
    shape = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tok),
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=True,
        max_position_embeddings=256,
    )
    config = AutoConfig.for_model(model_type, **{**shape, **FAMILIES.get(model_type, {}), **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return str(directory)
