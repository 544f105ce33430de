"""``slimrl plan``: the meta-device traces, the depth extrapolation, the CLI's JSON and its bad-input lines."""

from __future__ import annotations

import json

import pytest
import torch

from slimrl.cli import plan as plan_cli
from slimrl.compat.memory import parse_bytes
from slimrl.planning import PlanInputError, Settings, plan, trace
from slimrl.planning.plan import _with_layers


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory):
    """The calibration (about 8 s) is measured once for this module, into a temporary cache, not ~/.cache."""
    import os

    before = os.environ.get("SLIMRL_CACHE")
    os.environ["SLIMRL_CACHE"] = str(tmp_path_factory.mktemp("slimrl-cache"))
    yield
    if before is None:
        os.environ.pop("SLIMRL_CACHE")
    else:
        os.environ["SLIMRL_CACHE"] = before


def _config(layers=6):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)


def test_meta_trace_counts_what_checkpointing_keeps():
    """Checkpointed, the forward keeps each layer's input (rows x tokens x hidden, fp32) plus the final norm's and
    the head's inputs; without checkpointing every layer keeps many times that."""
    rows, prompt, completion = 4, 16, 48
    layer_input = rows * (prompt + completion) * 64 * 4
    kept = {}
    for every in (0, 1):
        model = trace.meta_model(_config(), torch.float32, 8, every)
        kept[every], peak = trace.trace_logprob_pass(model, rows, prompt, completion, grad=True, entropy=True,
                                                     chunk_rows=32)
        assert peak >= kept[every] > 0
    assert 6 * layer_input <= kept[1] <= 10 * layer_input, kept[1] / layer_input
    assert kept[0] > 4 * kept[1]


def test_attention_is_traced_as_a_fused_kernel():
    """The real kernels (flash / memory-efficient, CPU and CUDA) keep no [B, heads, T, T] scores; the meta trace
    must not either: without checkpointing, twice the tokens keep about twice the bytes (the math form: ~3x here)."""
    model = trace.meta_model(_config(), torch.float32, 8, 0)
    short, _ = trace.trace_logprob_pass(model, 4, 16, 112, grad=True, entropy=True, chunk_rows=64)
    long, _ = trace.trace_logprob_pass(model, 4, 16, 240, grad=True, entropy=True, chunk_rows=64)
    assert 1.8 < long / short < 2.2, long / short


def test_weights_views_are_not_counted_as_new_memory():
    model = trace.meta_model(_config(), torch.float32, 0, 0)
    with trace.LiveBytes(trace._state(model)) as live:
        [p.t() for p in model.parameters() if p.dim() == 2]
    assert live.peak == 0


def test_depth_extrapolation_equals_the_full_trace(tmp_path):
    """The plan traces models of 2n and 3n layers and extrapolates; on a 7-layer model it must equal the trace of all
    7 layers (activations and peaks are affine in the number of identical layers past the first)."""
    config = _config(layers=7)
    config.save_pretrained(tmp_path)
    for mode in ("true", "false"):
        p = plan(str(tmp_path), Settings(per_device_train_batch_size=4, max_prompt_length=16,
                                         max_completion_length=48, lora_r=8, gradient_checkpointing=mode,
                                         chunk_rows=32), search=False)
        full = trace.meta_model(config, torch.float32, 8, 1 if mode == "true" else 0)
        kept, peak = trace.trace_logprob_pass(full, 4, 16, 48, grad=True, entropy=True, chunk_rows=32)
        assert p.phases["policy_forward"] == pytest.approx(kept, rel=1e-3)
        assert p.phases["backward"] == pytest.approx(peak, rel=1e-3)
    smaller = _with_layers(config, 2)
    assert smaller.num_hidden_layers == 2 and config.num_hidden_layers == 7


def test_plan_phases_budget_and_search(tmp_path):
    _config(layers=4).save_pretrained(tmp_path)
    kwargs = dict(per_device_train_batch_size=4, max_prompt_length=16, max_completion_length=256, lora_r=8,
                  beta=0.04)
    p = plan(str(tmp_path), Settings(**kwargs), search=False)
    assert set(p.phases) == {"runtime", "weights", "adapter_and_optimizer", "generation", "logprobs_no_grad",
                             "policy_forward", "backward"}
    assert p.phases["adapter_and_optimizer"] == 16 * 4 * 8 * (64 + 64 + 64 + 32 + 64 + 32 + 64 + 64 + 64 + 160
                                                              + 64 + 160 + 160 + 64)
    assert p.step_seconds > 0 and set(p.step_split) <= set(p.phases)
    tight = plan(str(tmp_path), Settings(**kwargs), budget=p.peak_bytes - 1)
    assert tight.fits is False and tight.max_completion_length_that_fits < 256
    assert "over the budget" in tight.notes[0]
    from slimrl.planning.plan import _fastest_fitting, _longest_fitting, load_config

    config, settings = load_config(str(tmp_path)), dict(tight.settings)
    roomy = p.peak_bytes + 2**30
    assert _fastest_fitting(config, settings, roomy, 0.5, None)["gradient_checkpointing"] == "false"  # no recompute
    longest = tight.max_completion_length_that_fits
    assert plan(str(tmp_path), Settings(**dict(kwargs, max_completion_length=longest)),
                search=False).peak_bytes <= p.peak_bytes
    assert plan(str(tmp_path), Settings(**dict(kwargs, max_completion_length=longest + 64)),
                search=False).peak_bytes > p.peak_bytes - 1
    assert _longest_fitting(config, settings, roomy, 0.5, None) > 256


def test_cli_json_has_the_documented_keys(tmp_path, capsys):
    _config(layers=2).save_pretrained(tmp_path)
    from slimrl.cli import main

    assert main(["plan", "--model", str(tmp_path), "--max_completion_length", "32", "--max_prompt_length", "8",
                          "--per_device_train_batch_size", "2", "--budget", "20GB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"peak_bytes", "phases", "step_seconds", "fits", "recommended",
            "max_completion_length_that_fits"} <= set(data)
    assert data["fits"] is True and data["peak_bytes"] == pytest.approx(sum(data["phases"].values()), rel=0.2)


@pytest.mark.parametrize("argv,message", [
    (["--algorithm", "ppo"], "--algorithm 'ppo': unknown; choose one of grpo, dpo, kto, orpo, cpo, sft, rloo"),
    (["--budget", "1MB"], "--budget 1MB: below the weights and runtime alone"),
    (["--budget", "lots"], "--budget 'lots': not a size"),
    (["--gradient_checkpointing", "some"], "--gradient_checkpointing 'some': choose one of"),
    (["--model", "./no/such/dir"], "--model ./no/such/dir: no such file or directory"),
    (["--model", "nobody/not-cached"], "config.json is not in the local Hugging Face cache"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    _config(layers=2).save_pretrained(tmp_path)
    model = [] if "--model" in argv else ["--model", str(tmp_path)]
    assert plan_cli.main(model + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_parse_bytes_and_direct_errors():
    assert parse_bytes("20GB") == 20 * 2**30 and parse_bytes("512 MiB") == 512 * 2**20 and parse_bytes("3") == 3
    with pytest.raises(PlanInputError, match="--per_device_train_batch_size 0"):
        plan("SmolLM2-135M-Instruct", Settings(per_device_train_batch_size=0))


def test_engine_on_cpu_counts_its_packed_copies_and_lora_slots():
    """The engine's computed part equals an independent count on the model built on the meta device: every linear
    weight of the decoder plus the LM head (oneDNN's packed copies, fp32), plus vLLM's LoRA slots (max rank x
    (in + out) per projection, three vocabulary-wide ones)."""
    from slimrl.planning import engine_cpu

    config = _config(layers=3)
    model = trace.meta_model(config, torch.float32, 0)
    packed = sum(m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear))
    proj = {"qkv": (64, 64 + 2 * 32), "o": (64, 64), "gate_up": (64, 320), "down": (160, 64)}
    slots = 3 * sum(i + o for i, o in proj.values()) + 3 * 300  # rank 8 is vLLM's smallest
    assert engine_cpu.computed_bytes(config, 8, torch.float32) == 4 * (packed + 8 * slots)
    assert engine_cpu.computed_bytes(config, 0, torch.float32) == 4 * packed


def test_engine_on_cpu_is_persistent_and_its_runtime_named_when_not_measured(monkeypatch):
    """With fast_inference on CPU the engine's bytes are held for the whole run (summed into the peak, not a phase);
    where vLLM cannot run here, the runtime part is left out and the plan says so."""
    from slimrl.planning import engine_cpu

    monkeypatch.setattr(engine_cpu, "runtime_bytes", lambda *a: (None, "vLLM not usable here (test)"))
    config = _config()
    hf = plan(config, Settings(lora_r=8, fast_inference=False), search=False)
    p = plan(config, Settings(lora_r=8, fast_inference=True), search=False)
    engine = engine_cpu.computed_bytes(config, 8, torch.float32)
    assert p.phases["engine"] == engine
    held = ("runtime", "weights", "adapter_and_optimizer", "engine")
    largest = max(v for k, v in p.phases.items() if k not in held)
    assert p.peak_bytes == sum(p.phases[k] for k in held) + largest
    assert "engine" not in hf.phases and any("runtime is not included" in n for n in p.notes)
    monkeypatch.setattr(engine_cpu, "runtime_bytes", lambda *a: (123 * 2**20, "measured"))
    import importlib

    importlib.import_module("slimrl.planning.plan")._TRACES.clear()  # the runtime is memoised per config
    measured = plan(config, Settings(lora_r=8, fast_inference=True), search=False)
    assert measured.phases["engine"] == engine + 123 * 2**20 and not measured.notes
