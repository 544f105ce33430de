"""The terms that make a CUDA plan lean and honest: LoRA under autocast (16-bit saved inputs) and slimrl's default
for ``unsloth_tiled_mlp`` (tile where the plan says it saves >= 10 % of the peak, on CUDA under checkpointing)."""

from __future__ import annotations

import pytest
import torch

from slimrl.planning import Settings, plan, trace


def _config(hidden=64, intermediate=160, layers=2, context=512):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=300,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
    )


def test_a_16_bit_lora_layer_saves_its_input_in_16_bits(monkeypatch):
    """Under autocast each adapted projection's ``lora_A`` saves a 16-bit copy of its input (PEFT's fp32 cast, cast
    back by autocast), not an fp32 one: without the term the trace keeps 2 more bytes per element of every adapted
    input (q, k, v, o, gate, up: hidden; down: intermediate) in every layer."""
    rows, tokens, hidden, intermediate, layers = 4, 64, 64, 160, 2
    model = trace.meta_model(_config(hidden, intermediate, layers), torch.bfloat16, 8, 0)
    lora = next(m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "_cast_input_dtype"))
    assert lora.lora_A["default"].weight.dtype == torch.bfloat16
    with_term, _ = trace.trace_logprob_pass(model, rows, 16, tokens - 16, grad=True, entropy=True, chunk_rows=32)
    monkeypatch.setattr(trace, "_lora_under_autocast", lambda model, dtype: None)
    model = trace.meta_model(_config(hidden, intermediate, layers), torch.bfloat16, 8, 0)
    without, _ = trace.trace_logprob_pass(model, rows, 16, tokens - 16, grad=True, entropy=True, chunk_rows=32)
    inputs = rows * tokens * (6 * hidden + intermediate) * layers * 2  # 2 bytes more per adapted input element
    assert inputs <= without - with_term <= 1.3 * inputs, (without - with_term) / inputs


def test_an_fp32_lora_model_is_traced_as_it_runs():
    """No autocast on an fp32 model (a CPU run): adapters and their saved inputs stay fp32."""
    model = trace.meta_model(_config(), torch.float32, 8, 0)
    lora = next(m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "_cast_input_dtype"))
    assert lora.lora_A["default"].weight.dtype == torch.float32


LONG = dict(
    per_device_train_batch_size=2,
    num_generations=2,
    max_prompt_length=16,
    max_completion_length=2032,
    lora_r=4,
    shared_prefix=False,
)


def test_the_default_tiles_on_cuda_where_the_recompute_dominates():
    config = _config(intermediate=2048, layers=4, context=8192)
    default = plan(config, Settings(device="cuda", **LONG), search=False)
    off = plan(config, Settings(device="cuda", tiled_mlp=False, **LONG), search=False)
    on = plan(config, Settings(device="cuda", tiled_mlp=True, **LONG), search=False)
    assert default.settings["tiled_mlp"] is True and default.peak_bytes == on.peak_bytes
    assert on.peak_bytes <= 0.9 * off.peak_bytes
    assert any("tiled MLP (slimrl's default" in n for n in default.notes)
    assert off.settings["tiled_mlp"] is False and not any("tiled MLP" in n for n in off.notes)  # the user's word kept


@pytest.mark.parametrize(
    "settings",
    [
        dict(device="cpu", **LONG),  # a CPU run: never
        dict(device="cuda", gradient_checkpointing="false", **LONG),  # no recompute to shrink
        dict(device="cuda", **{**LONG, "max_completion_length": 48}),  # short: tiles save < 10 %
    ],
)
def test_the_default_leaves_the_mlp_whole_where_tiles_do_not_pay(settings, monkeypatch, tmp_path):
    monkeypatch.setenv("SLIMRL_CACHE", str(tmp_path))  # a CPU plan's calibration, not into ~/.cache
    config = _config(intermediate=2048, layers=4, context=8192)
    got = plan(config, Settings(**settings), search=False)
    assert got.settings["tiled_mlp"] is False and not any("tiled MLP" in n for n in got.notes)


def test_the_cli_takes_auto_true_and_false(capsys, tmp_path):
    from slimrl.cli import plan as plan_cli

    path = tmp_path / "m"
    _config(intermediate=2048, layers=4, context=8192).save_pretrained(path)
    for word, expected in (("auto", True), ("false", False), ("TRUE", True)):
        argv = [
            "--model",
            str(path),
            "--device",
            "cuda",
            "--max_prompt_length",
            "16",
            "--max_completion_length",
            "2032",
            "--per_device_train_batch_size",
            "2",
            "--num_generations",
            "2",
            "--lora_r",
            "4",
            "--tiled_mlp",
            word,
            "--json",
        ]
        assert plan_cli.main(argv) == 0
        import json

        assert json.loads(capsys.readouterr().out)["settings"]["tiled_mlp"] is expected
