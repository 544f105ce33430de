"""``slimrl plan``: the meta-device traces, the depth extrapolation, the CLI's JSON and its bad-input lines."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from slimrl.cli import plan as plan_cli
from slimrl.compat.memory import parse_bytes
from slimrl.errors import InputError
from slimrl.planning import Settings, plan, trace
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

    return LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )


def test_meta_trace_counts_what_checkpointing_keeps():
    """Checkpointed, the forward keeps each layer's input (rows x tokens x hidden, fp32) plus the final norm's and
    the head's inputs; without checkpointing every layer keeps many times that."""
    rows, prompt, completion = 4, 16, 48
    layer_input = rows * (prompt + completion) * 64 * 4
    kept = {}
    for every in (0, 1):
        model = trace.meta_model(_config(), torch.float32, 8, every)
        kept[every], peak = trace.trace_logprob_pass(
            model, rows, prompt, completion, grad=True, entropy=True, chunk_rows=32
        )
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
        p = plan(
            str(tmp_path),
            Settings(
                per_device_train_batch_size=4,
                max_prompt_length=16,
                max_completion_length=48,
                lora_r=8,
                gradient_checkpointing=mode,
                chunk_rows=32,
                shared_prefix=False,
            ),
            search=False,
        )
        full = trace.meta_model(config, torch.float32, 8, 1 if mode == "true" else 0, fused=True)
        kept, peak = trace.trace_logprob_pass(full, 4, 16, 48, grad=True, entropy=True, chunk_rows=32)
        assert p.phases["policy_forward"] == pytest.approx(kept, rel=1e-3)
        assert p.phases["backward"] == pytest.approx(peak, rel=1e-3)
    smaller = _with_layers(config, 2)
    assert smaller.num_hidden_layers == 2 and config.num_hidden_layers == 7


def test_plan_phases_budget_and_search(tmp_path):
    _config(layers=4).save_pretrained(tmp_path)
    kwargs = dict(per_device_train_batch_size=4, max_prompt_length=16, max_completion_length=256, lora_r=8, beta=0.04)
    p = plan(str(tmp_path), Settings(**kwargs), search=False)
    assert set(p.phases) == {
        "runtime",
        "weights",
        "adapter_and_optimizer",
        "generation",
        "logprobs_no_grad",
        "policy_forward",
        "backward",
    }
    assert p.phases["adapter_and_optimizer"] == 16 * 4 * 8 * (
        64 + 64 + 64 + 32 + 64 + 32 + 64 + 64 + 64 + 160 + 64 + 160 + 160 + 64
    )
    generation = {"generation_prefill", "generation_decode"}  # the generation phase's time, in its two parts
    assert p.step_seconds > 0 and set(p.step_split) - generation <= set(p.phases) and generation <= set(p.step_split)
    tight = plan(str(tmp_path), Settings(**kwargs), budget=p.peak_bytes - 1)
    assert tight.fits is False and tight.max_completion_length_that_fits < 256
    assert tight.verdict == "does not fit" and tight.notes[0].startswith("does not fit: predicted peak")
    assert any(n.startswith("to fit: ") for n in tight.notes)
    from slimrl.planning.plan import _fastest_fitting, _longest_fitting, load_config

    # the settings as plan() resolved them (its report, the engine's share and chunk rows at their defaults)
    config, settings = load_config(str(tmp_path)), Settings(**{k: v for k, v in tight.settings.items() if k != "model"})
    roomy = p.peak_bytes + 2**30
    assert _fastest_fitting(config, settings, roomy)["gradient_checkpointing"] == "false"  # no recompute
    longest = tight.max_completion_length_that_fits
    assert (
        plan(str(tmp_path), Settings(**dict(kwargs, max_completion_length=longest)), search=False).peak_bytes
        <= p.peak_bytes
    )
    assert (
        plan(str(tmp_path), Settings(**dict(kwargs, max_completion_length=longest + 64)), search=False).peak_bytes
        > p.peak_bytes - 1
    )
    assert _longest_fitting(config, settings, roomy) > 256


def test_cli_json_has_the_documented_keys(tmp_path, capsys):
    _config(layers=2).save_pretrained(tmp_path)
    from slimrl.cli import main

    assert (
        main(
            [
                "plan",
                "--model",
                str(tmp_path),
                "--max_completion_length",
                "32",
                "--max_prompt_length",
                "8",
                "--per_device_train_batch_size",
                "2",
                "--num_generations",
                "2",
                "--budget",
                "20GB",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert {"peak_bytes", "phases", "step_seconds", "fits", "recommended", "max_completion_length_that_fits"} <= set(
        data
    )
    assert data["fits"] is True and data["peak_bytes"] == pytest.approx(sum(data["phases"].values()), rel=0.2)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--algorithm", "ppo"], "--algorithm 'ppo': unknown; choose one of grpo, dpo, kto, orpo, cpo, sft, rloo"),
        (["--budget", "1MB"], "--budget 1MB: below the weights and runtime alone"),
        (["--budget", "lots"], "--budget 'lots': not a size"),
        (["--gradient_checkpointing", "some"], "--gradient_checkpointing 'some': choose one of"),
        (["--model", "./no/such/dir"], "--model ./no/such/dir: no such file or directory"),
        (["--model", "nobody/not-cached"], "config.json is not in the local Hugging Face cache"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, message):
    _config(layers=2).save_pretrained(tmp_path)
    model = [] if "--model" in argv else ["--model", str(tmp_path)]
    assert plan_cli.main(model + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_parse_bytes_and_direct_errors():
    assert parse_bytes("20GB") == 20 * 2**30 and parse_bytes("512 MiB") == 512 * 2**20 and parse_bytes("3") == 3
    with pytest.raises(InputError, match="--per_device_train_batch_size 0"):
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


def _policy_trace(config, seqs, prompt, completion):
    model = trace.meta_model(config, torch.float32, 8, 1, fused=True)  # get_peft_model fuses by default
    return trace.trace_logprob_pass(model, seqs, prompt, completion, grad=True, entropy=True, chunk_rows=32)


@pytest.mark.parametrize("rows", [8, 4])
def test_shared_prefix_plans_packed_rows(rows):
    """With the layout, the policy pass over ``rows`` rows of one group (G = 8) is traced as one packed row of the
    prompt and ``rows`` completions, plus the attention's gathered prompt keys/values of one layer
    (2 x rows x heads x (P + C) x head_dim fp32; its causal mask is no tensor); TRL's layout as ``rows`` rows of
    prompt + completion. Step time follows the tokens: 128 + rows*16 against rows*(128 + 16)."""
    config, prompt, completion = _config(layers=7), 128, 16
    kw = dict(
        per_device_train_batch_size=rows,
        num_generations=8,
        max_prompt_length=prompt,
        max_completion_length=completion,
        lora_r=8,
        gradient_checkpointing="true",
        chunk_rows=32,
    )
    on = plan(config, Settings(**kw), search=False)
    off = plan(config, Settings(**kw, shared_prefix=False), search=False)
    assert on.settings["shared_prefix"] is True and off.settings["shared_prefix"] is False
    kept, peak = _policy_trace(config, 1, prompt, rows * completion)
    gathered = 2 * rows * 4 * (prompt + completion) * 16 * 4
    assert on.phases["policy_forward"] == pytest.approx(kept, rel=1e-3)
    assert on.phases["backward"] == pytest.approx(peak + gathered, rel=1e-3)
    kept_off, peak_off = _policy_trace(config, rows, prompt, completion)
    assert off.phases["backward"] == pytest.approx(peak_off, rel=1e-3) and kept < kept_off
    ratio = on.step_split["policy_forward"] / off.step_split["policy_forward"]
    tokens = (prompt + rows * completion) / (rows * (prompt + completion))
    assert tokens * 0.9 < ratio < tokens * 1.2, (ratio, tokens)  # the head's share is the same on both sides
    for key in ("generation_prefill", "generation_decode"):
        assert on.step_split[key] == off.step_split[key]


def test_shared_prefix_is_planned_only_where_it_runs():
    """Planned for GRPO and RLOO; not planned: one completion per prompt, a trainer that does not generate, a family
    the layout is not tested on, a sliding window shorter than the row."""
    from transformers import GPT2Config, MistralConfig

    from slimrl.patching.table import PLANNED
    from slimrl.planning.phases import shared_prefix_applies

    base = Settings(max_prompt_length=64, max_completion_length=64)
    config = _config()
    assert shared_prefix_applies(config, base)
    assert shared_prefix_applies(config, replace(base, workload=PLANNED["grpo"]))
    assert shared_prefix_applies(config, replace(base, workload=PLANNED["rloo"]))
    assert not shared_prefix_applies(config, replace(base, num_generations=1))
    assert not shared_prefix_applies(config, replace(base, shared_prefix=False))
    for name in ("dpo", "sft"):
        assert not shared_prefix_applies(config, replace(base, workload=PLANNED[name])), name
    assert not shared_prefix_applies(GPT2Config(n_layer=2, n_embd=64, n_head=4), base)
    window = MistralConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=96,
    )
    assert not shared_prefix_applies(window, base)
    assert shared_prefix_applies(window, replace(base, max_completion_length=16))


def test_cli_takes_shared_prefix_off(tmp_path, capsys):
    _config(layers=2).save_pretrained(tmp_path)
    argv = ["--model", str(tmp_path), "--max_prompt_length", "64", "--max_completion_length", "16"]
    assert plan_cli.main(argv + ["--json"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert plan_cli.main(argv + ["--json", "--shared_prefix", "false"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert on["settings"]["shared_prefix"] is True and off["settings"]["shared_prefix"] is False
    assert on["step_split"]["backward"] < off["step_split"]["backward"]
    assert plan_cli.main(argv) == 0
    assert "each prompt once per group" in capsys.readouterr().out


def test_forward_flops_pairs_default_is_causal_per_row():
    from slimrl.planning.timing import forward_flops

    kw = dict(params=1000, layers=2, hidden=8, vocab=50)
    assert forward_flops(300, 100, 40, **kw) == forward_flops(300, 100, 40, **kw, pairs=300 * 100 / 2)
    assert forward_flops(300, 100, 40, **kw, pairs=0) == 300 * 2 * 1000 + 40 * 2 * 8 * 50


def test_cuda_plan_keeps_offloaded_layer_inputs_off_the_gpu():
    """On CUDA, slimrl's checkpointing keeps each layer's input in host memory: both gradient phases drop by the
    inputs of all but two layers (the one recomputed and the one copied ahead), plain checkpointing keeps them."""
    import torch
    from transformers import LlamaConfig

    from slimrl.planning import Settings, plan

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    common = dict(
        per_device_train_batch_size=2,
        num_generations=2,
        max_prompt_length=16,
        max_completion_length=240,
        lora_r=4,
        device="cuda",
        shared_prefix=False,
    )
    ours, plain = (
        plan(config, Settings(gradient_checkpointing=ck, **common), search=False) for ck in ("slimrl", "true")
    )
    inputs = 4 * 2 * 256 * 64 * torch.bfloat16.itemsize  # (6 - 2) layers x 2 rows x 256 tokens x hidden, bf16
    assert plain.phases["policy_forward"] - ours.phases["policy_forward"] == inputs
    assert plain.phases["backward"] - ours.phases["backward"] == inputs
    # in host memory instead: the offloader's pool, one buffer per layer rounded up to its granule
    from slimrl.models.offload import GRANULE

    assert ours.host_pinned_bytes == 4 * GRANULE and plain.host_pinned_bytes == 0
    assert "host_pinned_bytes" in ours.to_json()


def test_a_pool_past_its_share_of_host_ram_is_noted():
    from slimrl.planning.phases import pinned_host_bytes

    notes = []
    assert pinned_host_bytes(34 * 2**30, 34, notes, host_ram=int(12.7 * 2**30)) == 34 * 2**30
    assert notes and "more than the 40% of 12.7 GiB of RAM slimrl page-locks" in notes[0]
    assert pinned_host_bytes(2**30, 4, notes := [], host_ram=64 * 2**30) == 2**30 and not notes


def test_tiled_mlp_plans_one_tile_of_mlp_intermediates(capsys):
    """``unsloth_tiled_mlp``: the backward's recompute holds one tile's MLP intermediates instead of the whole
    micro-batch's; the forward's phase does not grow, and the CLI takes the option."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=2048,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
    )
    common = dict(
        per_device_train_batch_size=2,
        num_generations=2,
        max_prompt_length=16,
        max_completion_length=2032,
        lora_r=4,
        device="cuda",
        shared_prefix=False,
        fused_lora=False,  # PEFT's MLPs, tiled or whole
    )
    whole, tiled = (plan(config, Settings(tiled_mlp=t, **common), search=False) for t in (False, True))
    gate_up = 2 * 2 * 2048 * 2048 * torch.bfloat16.itemsize  # gate and up, [2 x 2,048 tokens, 2,048], bf16
    assert whole.phases["backward"] - tiled.phases["backward"] > gate_up, (whole.phases, tiled.phases)
    assert tiled.phases["policy_forward"] <= whole.phases["policy_forward"]
    # slimrl's fused MLP (one Function, its product in row chunks) keeps gate and up and one chunk's product
    fused = plan(config, Settings(tiled_mlp=False, **{**common, "fused_lora": True}), search=False)
    assert whole.phases["backward"] - fused.phases["backward"] > gate_up / 2, (whole.phases, fused.phases)
    with pytest.raises(InputError, match="--tiled_mlp"):
        plan(config, Settings(tiled_mlp="yes", **common), search=False)
