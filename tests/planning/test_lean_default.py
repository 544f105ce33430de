"""The terms that make a CUDA plan lean and honest: LoRA under autocast (16-bit saved inputs) and slimrl's default
for ``unsloth_tiled_mlp`` (on CUDA under checkpointing, tile only where the untiled peak is above what fits the
budget: :mod:`slimrl.planning.levers`)."""

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
    monkeypatch.setattr(trace, "_lora_under_autocast", lambda model, dtype, copies=True: None)
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


def _budget_for(aim: int) -> int:
    """The budget whose "fits" share on CUDA is ``aim`` bytes (give or take a KiB)."""
    from slimrl.planning.verdict import fitting_bytes

    lo, hi = aim, 1 << 40
    while hi - lo > 1024:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fitting_bytes(mid, "cuda") < aim else (lo, mid)
    return hi


WIDE = dict(intermediate=2048, layers=4, context=8192)


def _between() -> int:
    """A budget the tiled run fits and the untiled one does not."""
    config = _config(**WIDE)
    off = plan(config, Settings(device="cuda", tiled_mlp=False, gradient_checkpointing="true", **LONG), search=False)
    on = plan(config, Settings(device="cuda", tiled_mlp=True, gradient_checkpointing="true", **LONG), search=False)
    assert on.peak_bytes <= 0.9 * off.peak_bytes
    return _budget_for((on.peak_bytes + off.peak_bytes) // 2)


def test_the_default_tiles_on_cuda_where_the_untiled_run_does_not_fit():
    config = _config(**WIDE)
    budget = _between()
    plain = dict(device="cuda", gradient_checkpointing="true", **LONG)  # the user's checkpointing: no offload lever
    default = plan(config, Settings(**plain), budget=budget, search=False)
    on = plan(config, Settings(tiled_mlp=True, **plain), search=False)
    assert default.settings["tiled_mlp"] is True and default.peak_bytes == on.peak_bytes and default.fits
    assert any("slimrl's default applied tiled_mlp: predicted peak" in n for n in default.notes)
    off = plan(config, Settings(tiled_mlp=False, **plain), budget=budget, search=False)
    assert off.settings["tiled_mlp"] is False and not any("tiled_mlp:" in n for n in off.notes)  # the user's word


def test_auto_checkpointing_offloads_first_where_it_is_cheaper_and_only_where_needed():
    """Both levers left to slimrl (``gradient_checkpointing="auto"``, ``tiled_mlp`` auto) at a budget either one
    meets: the offload's copies hide behind the compute (pinned host memory), so it is priced below one more MLP
    forward per layer and applied alone; with pageable copies (synchronous) the price turns; with room, only the
    offload that costs no time."""
    config = _config(**WIDE)
    auto = dict(device="cuda", **LONG)
    peaks = {
        (mode, tiled): plan(
            config, Settings(gradient_checkpointing=mode, tiled_mlp=tiled, **auto), search=False
        ).peak_bytes
        for mode, tiled in (("true", False), ("slimrl", False), ("true", True))
    }
    either = max(peaks[("slimrl", False)], peaks[("true", True)])
    assert either < peaks[("true", False)]
    budget = _budget_for((either + peaks[("true", False)]) // 2)
    got = plan(config, Settings(**auto), budget=budget, search=False)
    assert got.settings["gradient_checkpointing"] == "slimrl" and got.settings["tiled_mlp"] is False and got.fits
    assert any("slimrl's default applied offload:" in n for n in got.notes)
    pageable = plan(config, Settings(host_pinning=False, **auto), budget=budget, search=False)
    assert pageable.settings["tiled_mlp"] is True and pageable.settings["gradient_checkpointing"] == "true"
    roomy = plan(config, Settings(**auto), budget=1 << 40, search=False)  # the offload costs no time: kept
    assert roomy.settings["gradient_checkpointing"] == "slimrl" and roomy.settings["tiled_mlp"] is False
    assert any("offload:" in n and "it costs no predicted time" in n for n in roomy.notes)
    roomy = plan(config, Settings(host_pinning=False, **auto), budget=1 << 40, search=False)  # it costs: off
    assert roomy.settings["gradient_checkpointing"] == "true" and roomy.settings["tiled_mlp"] is False


@pytest.mark.parametrize(
    "settings, budget",
    [
        (dict(device="cpu", **LONG), "tight"),  # a CPU run: never
        (dict(device="cuda", gradient_checkpointing="false", **LONG), "tight"),  # no recompute to shrink
        (dict(device="cuda", **LONG), None),  # no budget known: nothing bought with time
        (dict(device="cuda", gpu="h200", **LONG), None),  # the card has room
    ],
)
def test_the_default_leaves_the_mlp_whole_where_tiles_are_not_needed(settings, budget, monkeypatch, tmp_path):
    monkeypatch.setenv("SLIMRL_CACHE", str(tmp_path))  # a CPU plan's calibration, not into ~/.cache
    config = _config(**WIDE)
    got = plan(config, Settings(**settings), budget=_between() if budget else None, search=False)
    assert got.settings["tiled_mlp"] is False and not any("tiled_mlp:" in n for n in got.notes)


def test_the_cli_takes_auto_true_and_false(capsys, tmp_path):
    from slimrl.cli import plan as plan_cli

    path = tmp_path / "m"
    _config(intermediate=2048, layers=4, context=8192).save_pretrained(path)
    for word, expected in (("auto", False), ("false", False), ("TRUE", True)):  # auto: no budget, nothing needed
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
