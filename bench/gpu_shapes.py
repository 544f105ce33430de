"""The public model shapes the GPU benches build (config.json values that set memory and compute; random weights),
and the one random-init copy of each saved for the sides to load."""

from __future__ import annotations

import os

SHAPES: dict[str, dict] = {
    "tiny": dict(
        model_type="llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
    ),
    "llama-3.2-3b": dict(
        model_type="llama",
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        rope_theta=5e5,
        rms_norm_eps=1e-5,
    ),
    "qwen3-4b": dict(
        model_type="qwen3",
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
    ),
    "llama-3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        rope_theta=5e5,
        rms_norm_eps=1e-5,
    ),
    "qwen3-8b": dict(
        model_type="qwen3",
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
    ),
}


def model_dir(shape: str, cache: str, device: str) -> str:
    """Random-init ``shape`` saved once (bf16 for CUDA, fp32 for CPU) with a character tokenizer; its path."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from slimrl.verify.tiny import char_tokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    path = os.path.join(cache, f"{shape}-{str(dtype).split('.')[-1]}")
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    tok = char_tokenizer()
    cfg = AutoConfig.for_model(
        **SHAPES[shape], pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(path + ".partial")
    tok.save_pretrained(path + ".partial")
    os.replace(path + ".partial", path)
    return path
